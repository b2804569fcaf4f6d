#include "qrt/timeline/gap_index.hpp"

#include <algorithm>

namespace qrt::timeline {

void gap_index::clear() {
    _nodes.clear();
    _free.clear();
    _root = -1;
    _size = 0;
}

std::int32_t gap_index::alloc(gap g) {
    // xorshift64: deterministic priorities, so runs are reproducible.
    _rng ^= _rng << 13U;
    _rng ^= _rng >> 7U;
    _rng ^= _rng << 17U;
    const node n{g.start_ns, g.end_ns, g.end_ns - g.start_ns,
                 static_cast<std::uint32_t>(_rng >> 32U), -1, -1};
    if (!_free.empty()) {
        const std::int32_t idx = _free.back();
        _free.pop_back();
        at(idx) = n;
        return idx;
    }
    _nodes.push_back(n);
    return static_cast<std::int32_t>(_nodes.size() - 1);
}

std::int64_t gap_index::max_len(std::int32_t n) const noexcept {
    return n < 0 ? -1 : at(n).max_len_ns;
}

void gap_index::update(std::int32_t n) noexcept {
    node& x = at(n);
    x.max_len_ns = std::max({x.end_ns - x.start_ns, max_len(x.left), max_len(x.right)});
}

void gap_index::split(std::int32_t t, std::int64_t key, std::int32_t& l, std::int32_t& r) {
    if (t < 0) {
        l = -1;
        r = -1;
        return;
    }
    if (at(t).start_ns < key) {
        std::int32_t rl = -1;
        split(at(t).right, key, rl, r);
        at(t).right = rl;
        l = t;
    } else {
        std::int32_t lr = -1;
        split(at(t).left, key, l, lr);
        at(t).left = lr;
        r = t;
    }
    update(t);
}

std::int32_t gap_index::merge(std::int32_t l, std::int32_t r) {
    if (l < 0) {
        return r;
    }
    if (r < 0) {
        return l;
    }
    if (at(l).prio > at(r).prio) {
        at(l).right = merge(at(l).right, r);
        update(l);
        return l;
    }
    at(r).left = merge(l, at(r).left);
    update(r);
    return r;
}

void gap_index::insert(gap g) {
    const std::int32_t n = alloc(g);
    std::int32_t l = -1;
    std::int32_t r = -1;
    split(_root, g.start_ns, l, r);
    _root = merge(merge(l, n), r);
    ++_size;
}

bool gap_index::erase(std::int64_t start_ns) {
    std::int32_t l = -1;
    std::int32_t mr = -1;
    split(_root, start_ns, l, mr);
    std::int32_t m = -1;
    std::int32_t r = -1;
    split(mr, start_ns + 1, m, r);
    const bool found = m >= 0;
    if (found) {
        // start keys are unique, so m is a single node.
        _free.push_back(m);
        --_size;
    }
    _root = merge(l, r);
    return found;
}

std::optional<gap_index::gap> gap_index::find(std::int64_t start_ns) const {
    std::int32_t n = _root;
    while (n >= 0) {
        const node& x = at(n);
        if (x.start_ns == start_ns) {
            return gap{x.start_ns, x.end_ns};
        }
        n = start_ns < x.start_ns ? x.left : x.right;
    }
    return std::nullopt;
}

std::optional<gap_index::gap> gap_index::containing(std::int64_t t_ns) const {
    // Floor search: the gap with the greatest start <= t.
    std::int32_t n = _root;
    std::int32_t best = -1;
    while (n >= 0) {
        const node& x = at(n);
        if (x.start_ns <= t_ns) {
            best = n;
            n = x.right;
        } else {
            n = x.left;
        }
    }
    if (best >= 0 && at(best).end_ns > t_ns) {
        return gap{at(best).start_ns, at(best).end_ns};
    }
    return std::nullopt;
}

std::int32_t gap_index::first_fit_at(std::int32_t n, std::int64_t min_start_ns,
                                     std::int64_t len_ns) const {
    while (n >= 0) {
        const node& x = at(n);
        if (x.max_len_ns < len_ns) {
            return -1;
        }
        if (x.start_ns < min_start_ns) {
            n = x.right;
            continue;
        }
        const std::int32_t in_left = first_fit_at(x.left, min_start_ns, len_ns);
        if (in_left >= 0) {
            return in_left;
        }
        if (x.end_ns - x.start_ns >= len_ns) {
            return n;
        }
        n = x.right;
    }
    return -1;
}

std::optional<gap_index::gap> gap_index::first_fit(std::int64_t min_start_ns,
                                                   std::int64_t len_ns) const {
    const std::int32_t n = first_fit_at(_root, min_start_ns, len_ns);
    if (n < 0) {
        return std::nullopt;
    }
    return gap{at(n).start_ns, at(n).end_ns};
}

std::optional<gap_index::gap> gap_index::first() const {
    std::int32_t n = _root;
    if (n < 0) {
        return std::nullopt;
    }
    while (at(n).left >= 0) {
        n = at(n).left;
    }
    return gap{at(n).start_ns, at(n).end_ns};
}

std::vector<gap_index::gap> gap_index::to_vector() const {
    std::vector<gap> out;
    out.reserve(_size);
    std::vector<std::int32_t> stack;
    std::int32_t n = _root;
    while (n >= 0 || !stack.empty()) {
        while (n >= 0) {
            stack.push_back(n);
            n = at(n).left;
        }
        n = stack.back();
        stack.pop_back();
        out.push_back(gap{at(n).start_ns, at(n).end_ns});
        n = at(n).right;
    }
    return out;
}

}  // namespace qrt::timeline
