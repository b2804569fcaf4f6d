#pragma once
// Errors by layer: rtcore returns result<T>; the message names the failing
// call and the path ("write /proc/irq/36/smp_affinity_list: Input/output
// error").  code is a positive errno value, or 0 for errors that are not
// system-call failures (parse errors, policy refusals).
//
// This is a deliberately small stand-in for std::expected: g++ 12 has
// <expected>, but clang 14 (used for the libFuzzer build) cannot compile it.

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>
#include <variant>

namespace rtcore {

struct error {
    int code = 0;          // errno value, 0 when not from a system call
    std::string message;   // names the call, the path and the cause

    // "<what>: <strerror(err)>" for a failed system call.  err is the errno
    // value taken on the line after the failing call, before the message is
    // built (building it allocates, and may change errno):
    //
    //     if (::open(path.c_str(), O_RDONLY) < 0) {
    //         const int err = errno;
    //         return error::from_errno(err, "open " + path);
    //     }
    //
    // Passing errno itself, or any other modifiable int, does not compile
    // (the deleted overload below wins): the order in which a call's
    // arguments are evaluated is unspecified, so errno could be read after
    // the message had been built.  A const int, a literal or a computed value
    // (-rc, ec.value()) is taken as it is.
    static error from_errno(const int& err, const std::string& what) {
        return error{err, what + ": " + std::generic_category().message(err)};
    }
    static error from_errno(int& err, const std::string& what) = delete;
    static error invalid(std::string what) { return error{EINVAL, std::move(what)}; }
};

// The storage and accessors of a result, for any error type E: rtcore's
// own result<T> below, and layers whose errors carry more than an errno
// (the timeline's stable reason strings) alias it with their error struct.
template <typename T, typename E>
class [[nodiscard]] basic_result {
public:
    basic_result(T value) : _v(std::in_place_index<0>, std::move(value)) {}  // NOLINT implicit
    basic_result(E err) : _v(std::in_place_index<1>, std::move(err)) {}      // NOLINT implicit

    bool has_value() const noexcept { return _v.index() == 0; }
    explicit operator bool() const noexcept { return has_value(); }

    T& value() & { return std::get<0>(_v); }
    const T& value() const& { return std::get<0>(_v); }
    T&& value() && { return std::get<0>(std::move(_v)); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    const E& err() const& { return std::get<1>(_v); }
    E&& err() && { return std::get<1>(std::move(_v)); }

    template <typename U>
    T value_or(U&& fallback) const& {
        return has_value() ? value() : static_cast<T>(std::forward<U>(fallback));
    }

private:
    std::variant<T, E> _v;
};

template <typename E>
class [[nodiscard]] basic_result<void, E> {
public:
    basic_result() = default;
    basic_result(E err) : _err(std::move(err)), _ok(false) {}  // NOLINT implicit
    bool has_value() const noexcept { return _ok; }
    explicit operator bool() const noexcept { return _ok; }
    const E& err() const& { return _err; }
    E&& err() && { return std::move(_err); }

private:
    E _err;
    bool _ok = true;
};

template <typename T>
using result = basic_result<T, error>;

using status = result<void>;

inline status ok() { return {}; }

}  // namespace rtcore
