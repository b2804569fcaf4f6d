#pragma once
// Free time of one QPU: the calibration windows minus the busy intervals,
// kept as disjoint gaps that never cross a window boundary.
//
// Layout is for the cache, because at 100k reservations a pointer-chasing
// tree (one miss per level) made a query 5x dearer than at 1k: gaps live in
// sorted blocks of 16..128 (one contiguous array each), a flat array of each
// block's first start is binary-searched to find a block, and a segment tree
// over the blocks' longest gap answers "first block at or after i holding a
// gap of at least len".  So "leftmost gap starting at or after t that is at
// least len long" costs O(log(n/B) + B) with a handful of cache misses.

#include <cstdint>
#include <optional>
#include <vector>

namespace qrt::timeline {

class gap_index {
public:
    struct gap {
        std::int64_t start_ns = 0;
        std::int64_t end_ns = 0;
        std::int64_t length_ns() const noexcept { return end_ns - start_ns; }
        bool operator==(const gap&) const = default;
    };

    void clear();
    std::size_t size() const noexcept { return _size; }
    // The caller guarantees start < end and no overlap with existing gaps.
    void insert(gap g);
    bool erase(std::int64_t start_ns);
    std::optional<gap> find(std::int64_t start_ns) const;
    // The gap with start <= t < end.
    std::optional<gap> containing(std::int64_t t_ns) const;
    // The leftmost gap with start >= min_start_ns and length >= len_ns.
    std::optional<gap> first_fit(std::int64_t min_start_ns, std::int64_t len_ns) const;
    // The leftmost gap g with max(g.start, t) + len <= g.end: the earliest
    // place a len-long interval starting at or after t fits.
    std::optional<gap> first_fit_from(std::int64_t t_ns, std::int64_t len_ns) const;
    // The rightmost gap g with g.start + len <= min(g.end, max_end): the
    // latest place a len-long interval ending by max_end fits (a
    // calibration block, placed as late as it may be).
    std::optional<gap> last_fit(std::int64_t max_end_ns, std::int64_t len_ns) const;
    std::optional<gap> first() const;
    std::vector<gap> to_vector() const;

private:
    static constexpr std::size_t k_max_block = 128;
    static constexpr std::size_t k_min_block = 16;

    struct block {
        std::vector<gap> gaps;  // sorted by start
        std::int64_t max_len_ns = 0;
    };

    std::size_t locate(std::int64_t t_ns) const noexcept;  // block whose range holds t
    void refresh(std::size_t b);                            // max_len, first start, tree leaf
    void rebuild();                                         // after blocks were added/removed
    void seg_set(std::size_t b);
    std::size_t seg_first(std::size_t from, std::int64_t len_ns) const;  // npos if none
    std::size_t seg_last(std::size_t upto, std::int64_t len_ns) const;   // npos if none
    std::optional<gap> scan(std::size_t b, std::size_t from_pos, std::int64_t len_ns) const;

    std::vector<block> _blocks;
    std::vector<std::int64_t> _firsts;  // first start of every block
    std::vector<std::int64_t> _seg;     // max-tree over blocks, leaves at _cap
    std::size_t _cap = 0;
    std::size_t _size = 0;
};

}  // namespace qrt::timeline
