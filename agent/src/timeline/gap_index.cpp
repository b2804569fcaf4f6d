#include "qrt/timeline/gap_index.hpp"

#include <algorithm>

namespace qrt::timeline {

namespace {
constexpr std::size_t npos = static_cast<std::size_t>(-1);

bool start_less(const gap_index::gap& g, std::int64_t t) { return g.start_ns < t; }
bool less_start(std::int64_t t, const gap_index::gap& g) { return t < g.start_ns; }
}  // namespace

void gap_index::clear() {
    _blocks.clear();
    _firsts.clear();
    _seg.clear();
    _cap = 0;
    _size = 0;
}

std::size_t gap_index::locate(std::int64_t t_ns) const noexcept {
    // Last block whose first start <= t; block 0 when t is before everything.
    const auto it = std::upper_bound(_firsts.begin(), _firsts.end(), t_ns);
    if (it == _firsts.begin()) {
        return 0;
    }
    return static_cast<std::size_t>(it - _firsts.begin()) - 1;
}

void gap_index::seg_set(std::size_t b) {
    std::size_t i = _cap + b;
    _seg[i] = _blocks[b].max_len_ns;
    for (i /= 2; i >= 1; i /= 2) {
        _seg[i] = std::max(_seg[2 * i], _seg[2 * i + 1]);
    }
}

void gap_index::refresh(std::size_t b) {
    block& bl = _blocks[b];
    std::int64_t m = 0;
    for (const gap& g : bl.gaps) {
        m = std::max(m, g.end_ns - g.start_ns);
    }
    bl.max_len_ns = m;
    _firsts[b] = bl.gaps.front().start_ns;
    seg_set(b);
}

void gap_index::rebuild() {
    _firsts.resize(_blocks.size());
    _cap = 1;
    while (_cap < _blocks.size()) {
        _cap *= 2;
    }
    _seg.assign(2 * _cap, -1);
    for (std::size_t b = 0; b < _blocks.size(); ++b) {
        const block& bl = _blocks[b];
        std::int64_t m = 0;
        for (const gap& g : bl.gaps) {
            m = std::max(m, g.end_ns - g.start_ns);
        }
        _blocks[b].max_len_ns = m;
        _firsts[b] = bl.gaps.front().start_ns;
        _seg[_cap + b] = m;
    }
    for (std::size_t i = _cap - 1; i >= 1; --i) {
        _seg[i] = std::max(_seg[2 * i], _seg[2 * i + 1]);
    }
}

std::size_t gap_index::seg_first(std::size_t from, std::int64_t len_ns) const {
    if (from >= _blocks.size()) {
        return npos;
    }
    // Walk up from the leaf, looking right for a subtree that qualifies,
    // then down to its leftmost qualifying leaf.
    std::size_t i = _cap + from;
    if (_seg[i] >= len_ns) {
        return from;
    }
    for (;;) {
        while (i % 2 == 1) {  // right child: go up until we are a left child
            i /= 2;
            if (i == 0) {
                return npos;
            }
        }
        if (i == 0) {
            return npos;
        }
        ++i;  // the right sibling
        if (_seg[i] >= len_ns) {
            break;
        }
    }
    while (i < _cap) {
        i = _seg[2 * i] >= len_ns ? 2 * i : 2 * i + 1;
    }
    const std::size_t b = i - _cap;
    return b < _blocks.size() ? b : npos;
}

std::size_t gap_index::seg_last(std::size_t upto, std::int64_t len_ns) const {
    if (_blocks.empty()) {
        return npos;
    }
    upto = std::min(upto, _blocks.size() - 1);
    // Walk up from the leaf, looking left for a subtree that qualifies,
    // then down to its rightmost qualifying leaf.
    std::size_t i = _cap + upto;
    if (_seg[i] >= len_ns) {
        return upto;
    }
    for (;;) {
        while (i % 2 == 0) {  // left child: go up until we are a right child
            i /= 2;
        }
        if (i == 1) {
            return npos;  // the root: nothing further left
        }
        --i;  // the left sibling
        if (_seg[i] >= len_ns) {
            break;
        }
    }
    while (i < _cap) {
        i = _seg[2 * i + 1] >= len_ns ? 2 * i + 1 : 2 * i;
    }
    return i - _cap;
}

void gap_index::insert(gap g) {
    ++_size;
    if (_blocks.empty()) {
        _blocks.push_back(block{{g}, g.end_ns - g.start_ns});
        rebuild();
        return;
    }
    const std::size_t b = locate(g.start_ns);
    auto& gs = _blocks[b].gaps;
    gs.insert(std::upper_bound(gs.begin(), gs.end(), g.start_ns, less_start), g);
    if (gs.size() > k_max_block) {
        block tail;
        tail.gaps.assign(gs.begin() + static_cast<std::ptrdiff_t>(gs.size() / 2), gs.end());
        gs.resize(gs.size() / 2);
        _blocks.insert(_blocks.begin() + static_cast<std::ptrdiff_t>(b) + 1, std::move(tail));
        rebuild();
        return;
    }
    if (g.end_ns - g.start_ns > _blocks[b].max_len_ns || g.start_ns < _firsts[b]) {
        _blocks[b].max_len_ns = std::max(_blocks[b].max_len_ns, g.end_ns - g.start_ns);
        _firsts[b] = gs.front().start_ns;
        seg_set(b);
    }
}

bool gap_index::erase(std::int64_t start_ns) {
    if (_blocks.empty()) {
        return false;
    }
    const std::size_t b = locate(start_ns);
    auto& gs = _blocks[b].gaps;
    const auto it = std::lower_bound(gs.begin(), gs.end(), start_ns, start_less);
    if (it == gs.end() || it->start_ns != start_ns) {
        return false;
    }
    gs.erase(it);
    --_size;
    if (gs.empty()) {
        _blocks.erase(_blocks.begin() + static_cast<std::ptrdiff_t>(b));
        rebuild();
        return true;
    }
    if (gs.size() < k_min_block && _blocks.size() > 1) {
        // Merge with a neighbour (and split again if that is too big), so
        // blocks stay between k_min_block and k_max_block.
        const std::size_t left = b + 1 < _blocks.size() ? b : b - 1;
        auto& a = _blocks[left].gaps;
        auto& c = _blocks[left + 1].gaps;
        a.insert(a.end(), c.begin(), c.end());
        if (a.size() > k_max_block) {
            c.assign(a.begin() + static_cast<std::ptrdiff_t>(a.size() / 2), a.end());
            a.resize(a.size() / 2);
        } else {
            _blocks.erase(_blocks.begin() + static_cast<std::ptrdiff_t>(left) + 1);
        }
        rebuild();
        return true;
    }
    refresh(b);
    return true;
}

std::optional<gap_index::gap> gap_index::find(std::int64_t start_ns) const {
    if (_blocks.empty()) {
        return std::nullopt;
    }
    const auto& gs = _blocks[locate(start_ns)].gaps;
    const auto it = std::lower_bound(gs.begin(), gs.end(), start_ns, start_less);
    if (it == gs.end() || it->start_ns != start_ns) {
        return std::nullopt;
    }
    return *it;
}

std::optional<gap_index::gap> gap_index::containing(std::int64_t t_ns) const {
    if (_blocks.empty()) {
        return std::nullopt;
    }
    const auto& gs = _blocks[locate(t_ns)].gaps;
    auto it = std::upper_bound(gs.begin(), gs.end(), t_ns, less_start);
    if (it == gs.begin()) {
        return std::nullopt;
    }
    --it;
    if (it->end_ns > t_ns) {
        return *it;
    }
    return std::nullopt;
}

std::optional<gap_index::gap> gap_index::scan(std::size_t b, std::size_t from_pos,
                                              std::int64_t len_ns) const {
    const auto& gs = _blocks[b].gaps;
    for (std::size_t i = from_pos; i < gs.size(); ++i) {
        if (gs[i].end_ns - gs[i].start_ns >= len_ns) {
            return gs[i];
        }
    }
    return std::nullopt;
}

std::optional<gap_index::gap> gap_index::first_fit(std::int64_t min_start_ns,
                                                   std::int64_t len_ns) const {
    if (_blocks.empty()) {
        return std::nullopt;
    }
    const std::size_t b = locate(min_start_ns);
    const auto& gs = _blocks[b].gaps;
    const auto pos = static_cast<std::size_t>(
        std::lower_bound(gs.begin(), gs.end(), min_start_ns, start_less) - gs.begin());
    if (_blocks[b].max_len_ns >= len_ns) {
        if (auto g = scan(b, pos, len_ns)) {
            return g;
        }
    }
    const std::size_t next = seg_first(b + 1, len_ns);
    if (next == npos) {
        return std::nullopt;
    }
    return scan(next, 0, len_ns);
}

std::optional<gap_index::gap> gap_index::first_fit_from(std::int64_t t_ns,
                                                        std::int64_t len_ns) const {
    if (const auto c = containing(t_ns); c && c->end_ns - t_ns >= len_ns) {
        return c;
    }
    return first_fit(t_ns + 1, len_ns);
}

std::optional<gap_index::gap> gap_index::last_fit(std::int64_t max_end_ns, std::int64_t len_ns) const {
    if (_blocks.empty() || len_ns <= 0) {
        return std::nullopt;
    }
    // The block holding the last gap that starts before max_end: only there
    // may a gap reach past max_end; every earlier gap ends before it.
    const std::size_t b = locate(max_end_ns - 1);
    {
        const auto& gs = _blocks[b].gaps;
        auto pos = static_cast<std::size_t>(
            std::lower_bound(gs.begin(), gs.end(), max_end_ns, start_less) - gs.begin());
        while (pos > 0) {
            --pos;
            const gap& g = gs[pos];
            if (std::min(g.end_ns, max_end_ns) - g.start_ns >= len_ns) {
                return g;
            }
        }
    }
    if (b == 0) {
        return std::nullopt;
    }
    const std::size_t prev = seg_last(b - 1, len_ns);
    if (prev == npos) {
        return std::nullopt;
    }
    const auto& gs = _blocks[prev].gaps;
    for (std::size_t i = gs.size(); i > 0; --i) {
        if (gs[i - 1].end_ns - gs[i - 1].start_ns >= len_ns) {
            return gs[i - 1];
        }
    }
    return std::nullopt;
}

std::optional<gap_index::gap> gap_index::first() const {
    if (_blocks.empty()) {
        return std::nullopt;
    }
    return _blocks.front().gaps.front();
}

std::vector<gap_index::gap> gap_index::to_vector() const {
    std::vector<gap> out;
    out.reserve(_size);
    for (const block& b : _blocks) {
        out.insert(out.end(), b.gaps.begin(), b.gaps.end());
    }
    return out;
}

}  // namespace qrt::timeline
