#include "rtcore/text.hpp"

#include <algorithm>

namespace rtcore {

std::string_view trim(std::string_view s) noexcept {
    constexpr std::string_view blanks = " \t\n\r\v\f";
    const auto first = s.find_first_not_of(blanks);
    if (first == std::string_view::npos) {
        return {};
    }
    return s.substr(first, s.find_last_not_of(blanks) - first + 1);
}

bool decimal_id(std::string_view s) noexcept {
    return !s.empty() && s.size() <= 7 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string join_path(std::string_view dir, std::string_view name) {
    std::string p(dir);
    if (p.empty() || p.back() != '/') {
        p += '/';
    }
    p += name;
    return p;
}

bool has_word(std::string_view text, std::string_view word) noexcept {
    if (word.empty()) {
        return false;
    }
    constexpr std::string_view gaps = " \t\n";
    std::size_t pos = 0;
    while (pos < text.size()) {
        pos = text.find_first_not_of(gaps, pos);
        if (pos == std::string_view::npos) {
            break;
        }
        const auto end = text.find_first_of(gaps, pos);
        if (text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos) == word) {
            return true;
        }
        pos = end;
    }
    return false;
}

std::string one_line(std::string_view bytes) {
    std::string s(trim(bytes));
    std::replace(s.begin(), s.end(), '\n', ' ');
    if (s.size() > 60) {
        s = s.substr(0, 57) + "...";
    }
    return s.empty() ? "(empty)" : s;
}

}  // namespace rtcore
