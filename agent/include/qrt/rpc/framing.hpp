#pragma once
// Line framing for the control socket: bytes in, complete lines out, with the
// per-line byte limit enforced before a line is complete (so a peer cannot
// make the daemon buffer more than max_line_bytes + one read of input).
//
// Used by the socket server and by the fuzz target, so the fuzzer exercises
// exactly the framing the daemon runs.

#include <cstddef>
#include <string>
#include <string_view>

namespace qrt::rpc {

class line_framer {
public:
    explicit line_framer(std::size_t max_line_bytes) : _max(max_line_bytes) {}

    // Space for up to n more bytes (e.g. a recv() target); commit() what
    // was actually written.
    char* prepare(std::size_t n);
    void commit(std::size_t n) noexcept;
    void append(std::string_view bytes);

    enum class status : unsigned char { line, need_more, too_long };
    struct item {
        status st = status::need_more;
        std::string_view line;      // status::line: without its '\n'; valid
                                    // until the next prepare/append/compact
        std::size_t seen_bytes = 0;  // status::too_long: bytes seen of it
    };
    // The next complete line, or need_more, or too_long (the stream cannot
    // be resynchronised after that: the caller closes the connection).
    item next();

    // Drop consumed bytes (call after next() returned need_more).
    void compact();
    void clear() noexcept;
    std::size_t buffered() const noexcept { return _end - _off; }
    // Whether next() would return a line (or too_long) right now.
    bool has_complete_line() const noexcept;
    std::size_t max_line_bytes() const noexcept { return _max; }

private:
    std::size_t _max;
    // Storage: _buf[0, _end) holds data; the rest is spare room kept from
    // earlier reads, so prepare() does not zero-fill a read chunk per recv.
    std::string _buf;
    std::size_t _end = 0;
    std::size_t _off = 0;      // start of the first unconsumed line
    std::size_t _scanned = 0;  // _buf[_off, _scanned) holds no '\n'
    std::size_t _prepared = 0;
};

}  // namespace qrt::rpc
