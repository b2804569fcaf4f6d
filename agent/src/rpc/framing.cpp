#include "qrt/rpc/framing.hpp"

#include <algorithm>
#include <cstring>

namespace qrt::rpc {

char* line_framer::prepare(std::size_t n) {
    // Grow (and zero-fill) only when the spare room is short: a steady
    // stream of reads reuses the same bytes without touching them first.
    if (_buf.size() - _end < n) {
        _buf.resize(_end + n);
    }
    _prepared = _end;
    return _buf.data() + _end;
}

void line_framer::commit(std::size_t n) noexcept {
    _end = _prepared + std::min(n, _buf.size() - _prepared);
}

void line_framer::append(std::string_view bytes) {
    if (_buf.size() - _end < bytes.size()) {
        _buf.resize(_end + bytes.size());
    }
    if (!bytes.empty()) {
        std::memcpy(_buf.data() + _end, bytes.data(), bytes.size());
    }
    _end += bytes.size();
}

line_framer::item line_framer::next() {
    const std::size_t from = std::max(_scanned, _off);
    const void* hit = from < _end ? std::memchr(_buf.data() + from, '\n', _end - from) : nullptr;
    if (hit == nullptr) {
        _scanned = _end;
        if (_end - _off > _max) {
            return item{status::too_long, {}, _end - _off};
        }
        return item{status::need_more, {}, 0};
    }
    const auto nl = static_cast<std::size_t>(static_cast<const char*>(hit) - _buf.data());
    const std::size_t len = nl - _off;
    if (len > _max) {
        return item{status::too_long, {}, len};
    }
    item it{status::line, std::string_view(_buf.data() + _off, len), 0};
    _off = nl + 1;
    _scanned = _off;
    return it;
}

bool line_framer::has_complete_line() const noexcept {
    const std::size_t from = std::max(_scanned, _off);
    return (from < _end && std::memchr(_buf.data() + from, '\n', _end - from) != nullptr) ||
           _end - _off > _max;
}

void line_framer::compact() {
    if (_off == 0) {
        return;
    }
    const std::size_t rest = _end - _off;
    if (rest > 0) {
        std::memmove(_buf.data(), _buf.data() + _off, rest);
    }
    _end = rest;
    _scanned -= std::min(_scanned, _off);
    _off = 0;
}

void line_framer::clear() noexcept {
    _end = 0;
    _off = 0;
    _scanned = 0;
}

}  // namespace qrt::rpc
