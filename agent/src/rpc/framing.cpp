#include "qrt/rpc/framing.hpp"

#include <algorithm>

namespace qrt::rpc {

char* line_framer::prepare(std::size_t n) {
    _prepared = _buf.size();
    _buf.resize(_prepared + n);
    return _buf.data() + _prepared;
}

void line_framer::commit(std::size_t n) noexcept {
    _buf.resize(_prepared + std::min(n, _buf.size() - _prepared));
}

void line_framer::append(std::string_view bytes) { _buf.append(bytes); }

line_framer::item line_framer::next() {
    const std::size_t from = std::max(_scanned, _off);
    const std::size_t nl = _buf.find('\n', from);
    if (nl == std::string::npos) {
        _scanned = _buf.size();
        if (_buf.size() - _off > _max) {
            return item{status::too_long, {}, _buf.size() - _off};
        }
        return item{status::need_more, {}, 0};
    }
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
    return _buf.find('\n', std::max(_scanned, _off)) != std::string::npos ||
           _buf.size() - _off > _max;
}

void line_framer::compact() {
    if (_off == 0) {
        return;
    }
    _buf.erase(0, _off);
    _scanned -= std::min(_scanned, _off);
    _off = 0;
}

void line_framer::clear() noexcept {
    _buf.clear();
    _off = 0;
    _scanned = 0;
}

}  // namespace qrt::rpc
