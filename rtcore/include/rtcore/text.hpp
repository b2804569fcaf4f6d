#pragma once
// Small text helpers that qrtd's code shares: white space trimmed, a whole
// field read as a number, host paths joined, a word looked up in a kernel
// list, a value shown on one line of a report.  Pure functions; none
// touches the host.

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace rtcore {

// s without the ASCII white space (space, \t, \n, \r, \v, \f) at either
// end: a kernel file's "3\n", a config word, a request line's "\r".  A view
// into s, never a copy.
std::string_view trim(std::string_view s) noexcept;

// The whole of s as a decimal number of type T.  nullopt for an empty text,
// a sign where T is unsigned, anything after the digits, or a value that
// does not fit T.
template <typename T>
std::optional<T> parse_decimal(std::string_view s) noexcept {
    T v{};
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
}

// 1 to 7 decimal digits: the IRQ, CPU or pid component of a /proc or /sys
// path ("36" in /proc/irq/36/smp_affinity_list).
bool decimal_id(std::string_view s) noexcept;

// dir + "/" + name, with exactly one slash between them when dir already
// ends in one ("/sys/fs/cgroup" + "cpuset.cpus").
std::string join_path(std::string_view dir, std::string_view name);

// Whether word is one of the words of text, words being separated by
// spaces, tabs and newlines: "cpuset" in cgroup.controllers'
// "cpu cpuset memory\n".  An empty word is never found.
bool has_word(std::string_view text, std::string_view word) noexcept;

// A value read from or written to a kernel file, for one line of a report:
// spaces, tabs and a trailing newline trimmed, inner newlines shown as
// spaces, at most 60 characters (57 and "..."), "(empty)" for nothing.
std::string one_line(std::string_view bytes);

}  // namespace rtcore
