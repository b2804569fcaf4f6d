#pragma once
// A set of logical CPU numbers, with the kernel's two text forms:
//   list form  "0-3,8,10-11"          (cpuset.cpus, smp_affinity_list, isolcpus)
//   mask form  "ffffffff,00000003"    (smp_affinity, default_smp_affinity)
// Parsing is strict: any character out of place is an error that says where.

#include <bitset>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/error.hpp"

namespace rtcore {

class cpu_set {
public:
    static constexpr unsigned max_cpus = 4096;

    cpu_set() = default;
    cpu_set(std::initializer_list<unsigned> cpus);

    static result<cpu_set> parse_list(std::string_view text);
    static result<cpu_set> parse_mask(std::string_view text);
    // All CPUs 0..n-1.
    static cpu_set first_n(unsigned n);

    std::string to_list() const;                 // "" for the empty set
    // Kernel mask form, zero-padded to cover at least nbits bits, in comma
    // separated 32-bit groups, most significant first.
    std::string to_mask(unsigned nbits) const;

    void set(unsigned cpu) { _bits.set(cpu); }
    void reset(unsigned cpu) { _bits.reset(cpu); }
    bool test(unsigned cpu) const { return cpu < max_cpus && _bits.test(cpu); }
    std::size_t count() const { return _bits.count(); }
    bool empty() const { return _bits.none(); }
    std::vector<unsigned> cpus() const;
    int first() const;   // -1 when empty
    int last() const;    // -1 when empty

    bool is_subset_of(const cpu_set& other) const { return (_bits & ~other._bits).none(); }
    bool intersects(const cpu_set& other) const { return (_bits & other._bits).any(); }

    cpu_set operator|(const cpu_set& o) const { cpu_set r; r._bits = _bits | o._bits; return r; }
    cpu_set operator&(const cpu_set& o) const { cpu_set r; r._bits = _bits & o._bits; return r; }
    cpu_set operator-(const cpu_set& o) const { cpu_set r; r._bits = _bits & ~o._bits; return r; }
    cpu_set& operator|=(const cpu_set& o) { _bits |= o._bits; return *this; }
    bool operator==(const cpu_set& o) const { return _bits == o._bits; }

private:
    std::bitset<max_cpus> _bits;
};

}  // namespace rtcore
