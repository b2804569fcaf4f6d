#include "rtcore/cpu_set.hpp"

#include <charconv>

#include "rtcore/text.hpp"

namespace rtcore {

cpu_set::cpu_set(std::initializer_list<unsigned> cpus) {
    for (unsigned c : cpus) {
        _bits.set(c);
    }
}

cpu_set cpu_set::first_n(unsigned n) {
    cpu_set s;
    for (unsigned c = 0; c < n && c < max_cpus; ++c) {
        s._bits.set(c);
    }
    return s;
}

namespace {

result<unsigned> parse_cpu_number(std::string_view tok, std::string_view whole) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (tok.empty() || ec != std::errc{} || p != tok.data() + tok.size()) {
        return error::invalid("cpu list \"" + std::string(whole) + "\": \"" + std::string(tok) +
                              "\" is not a CPU number");
    }
    if (v >= cpu_set::max_cpus) {
        return error::invalid("cpu list \"" + std::string(whole) + "\": CPU " + std::to_string(v) +
                              " is beyond the supported maximum " +
                              std::to_string(cpu_set::max_cpus - 1));
    }
    return v;
}

}  // namespace

result<cpu_set> cpu_set::parse_list(std::string_view text) {
    const std::string_view whole = trim(text);
    cpu_set out;
    if (whole.empty()) {
        return out;
    }
    std::string_view rest = whole;
    while (true) {
        const auto comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        // Optional stride form a-b:s is not used by the kernel files we read.
        const auto dash = item.find('-');
        if (dash == std::string_view::npos) {
            auto v = parse_cpu_number(item, whole);
            if (!v) {
                return v.err();
            }
            out._bits.set(*v);
        } else {
            auto lo = parse_cpu_number(item.substr(0, dash), whole);
            if (!lo) {
                return lo.err();
            }
            auto hi = parse_cpu_number(item.substr(dash + 1), whole);
            if (!hi) {
                return hi.err();
            }
            if (*hi < *lo) {
                return error::invalid("cpu list \"" + std::string(whole) + "\": range \"" +
                                      std::string(item) + "\" runs backwards");
            }
            for (unsigned c = *lo; c <= *hi; ++c) {
                out._bits.set(c);
            }
        }
        if (comma == std::string_view::npos) {
            break;
        }
        rest.remove_prefix(comma + 1);
    }
    return out;
}

result<cpu_set> cpu_set::parse_mask(std::string_view text) {
    const std::string_view whole = trim(text);
    if (whole.empty()) {
        return error::invalid("cpu mask is empty");
    }
    cpu_set out;
    unsigned bit = 0;
    // Walk from the least significant (rightmost) digit.
    for (auto it = whole.rbegin(); it != whole.rend(); ++it) {
        const char ch = *it;
        if (ch == ',') {
            continue;
        }
        unsigned nib = 0;
        if (ch >= '0' && ch <= '9') {
            nib = static_cast<unsigned>(ch - '0');
        } else if (ch >= 'a' && ch <= 'f') {
            nib = static_cast<unsigned>(ch - 'a' + 10);
        } else if (ch >= 'A' && ch <= 'F') {
            nib = static_cast<unsigned>(ch - 'A' + 10);
        } else {
            return error::invalid("cpu mask \"" + std::string(whole) + "\": '" + std::string(1, ch) +
                                  "' is not a hex digit");
        }
        for (unsigned k = 0; k < 4; ++k, ++bit) {
            if ((nib >> k) & 1U) {
                if (bit >= max_cpus) {
                    return error::invalid("cpu mask \"" + std::string(whole) +
                                          "\" names a CPU beyond the supported maximum");
                }
                out._bits.set(bit);
            }
        }
    }
    return out;
}

std::string cpu_set::to_list() const {
    std::string out;
    unsigned c = 0;
    while (c < max_cpus) {
        if (!_bits.test(c)) {
            ++c;
            continue;
        }
        unsigned end = c;
        while (end + 1 < max_cpus && _bits.test(end + 1)) {
            ++end;
        }
        if (!out.empty()) {
            out += ',';
        }
        out += std::to_string(c);
        if (end > c) {
            out += '-';
            out += std::to_string(end);
        }
        c = end + 1;
    }
    return out;
}

std::string cpu_set::to_mask(unsigned nbits) const {
    const int hi = last();
    unsigned width = nbits;
    if (hi >= 0 && static_cast<unsigned>(hi) + 1 > width) {
        width = static_cast<unsigned>(hi) + 1;
    }
    const unsigned groups = width == 0 ? 1 : (width + 31) / 32;
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned g = groups; g-- > 0;) {
        if (!out.empty()) {
            out += ',';
        }
        for (unsigned n = 8; n-- > 0;) {
            unsigned nib = 0;
            for (unsigned k = 0; k < 4; ++k) {
                const unsigned b = g * 32 + n * 4 + k;
                if (b < max_cpus && _bits.test(b)) {
                    nib |= 1U << k;
                }
            }
            out += digits[nib];
        }
    }
    return out;
}

std::vector<unsigned> cpu_set::cpus() const {
    std::vector<unsigned> v;
    for (unsigned c = 0; c < max_cpus; ++c) {
        if (_bits.test(c)) {
            v.push_back(c);
        }
    }
    return v;
}

int cpu_set::first() const {
    for (unsigned c = 0; c < max_cpus; ++c) {
        if (_bits.test(c)) {
            return static_cast<int>(c);
        }
    }
    return -1;
}

int cpu_set::last() const {
    for (unsigned c = max_cpus; c-- > 0;) {
        if (_bits.test(c)) {
            return static_cast<int>(c);
        }
    }
    return -1;
}

}  // namespace rtcore
