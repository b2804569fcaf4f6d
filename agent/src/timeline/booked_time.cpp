// Each tenant's booked time as intervals (booked_time.hpp).
#include "qrt/timeline/booked_time.hpp"

#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>

#include <functional>
#include <map>
#include <string>
#include <utility>

namespace qrt::timeline {

namespace {

// A subtree's count of times and their sum (modulo 2^64).
struct count_sum {
    std::uint64_t count = 0;
    std::uint64_t sum = 0;
};

using point = std::pair<std::int64_t, std::uint64_t>;  // (time, reservation id)

// The node update of the trees: each node holds its subtree's count_sum,
// and below(t) adds up the points before t on one path from the root.
template <class NodeCItr, class NodeItr, class CmpFn, class Alloc>
class prefix_sums {
public:
    using metadata_type = count_sum;

    count_sum below(std::int64_t t) const {
        count_sum out;
        NodeCItr it = node_begin();
        const NodeCItr end = node_end();
        while (it != end) {
            const NodeCItr left = it.get_l_child();
            const point& p = **it;
            if (p.first < t) {
                if (left != end) {
                    out.count += left.get_metadata().count;
                    out.sum += left.get_metadata().sum;
                }
                out.count += 1;
                out.sum += static_cast<std::uint64_t>(p.first);
                it = it.get_r_child();
            } else {
                it = left;
            }
        }
        return out;
    }

    virtual ~prefix_sums() = default;

protected:
    // The tree calls this for each node whose children changed.
    void operator()(NodeItr it, NodeCItr end) const {
        const NodeItr left = it.get_l_child();
        const NodeItr right = it.get_r_child();
        count_sum m{1, static_cast<std::uint64_t>((**it).first)};
        if (left != end) {
            m.count += left.get_metadata().count;
            m.sum += left.get_metadata().sum;
        }
        if (right != end) {
            m.count += right.get_metadata().count;
            m.sum += right.get_metadata().sum;
        }
        const_cast<count_sum&>(it.get_metadata()) = m;
    }
    virtual NodeCItr node_begin() const = 0;
    virtual NodeCItr node_end() const = 0;
};

using point_tree = __gnu_pbds::tree<point, __gnu_pbds::null_type, std::less<>, __gnu_pbds::rb_tree_tag,
                                    prefix_sums>;

// sum over the points x of clamp(x, a, b), modulo 2^64.
std::uint64_t clamped_sum(const point_tree& t, std::int64_t a, std::int64_t b) {
    const count_sum lo = t.below(a);
    const count_sum hi = t.below(b);
    const auto n = static_cast<std::uint64_t>(t.size());
    return static_cast<std::uint64_t>(a) * lo.count + (hi.sum - lo.sum) +
           static_cast<std::uint64_t>(b) * (n - hi.count);
}

struct tenant_points {
    point_tree starts;
    point_tree ends;
};

}  // namespace

struct booked_time::impl {
    std::map<std::string, tenant_points, std::less<>> by_tenant;
    std::size_t intervals = 0;
};

booked_time::booked_time() : _impl(std::make_unique<impl>()) {}
booked_time::~booked_time() = default;
booked_time::booked_time(booked_time&&) noexcept = default;
booked_time& booked_time::operator=(booked_time&&) noexcept = default;

void booked_time::add(std::string_view tenant, std::uint64_t id, std::int64_t start_ns,
                      std::int64_t end_ns) {
    auto it = _impl->by_tenant.find(tenant);
    if (it == _impl->by_tenant.end()) {
        it = _impl->by_tenant.emplace(std::string(tenant), tenant_points{}).first;
    }
    if (it->second.starts.insert({start_ns, id}).second) {
        it->second.ends.insert({end_ns, id});
        ++_impl->intervals;
    }
}

void booked_time::remove(std::string_view tenant, std::uint64_t id, std::int64_t start_ns,
                         std::int64_t end_ns) {
    const auto it = _impl->by_tenant.find(tenant);
    if (it == _impl->by_tenant.end() || !it->second.starts.erase({start_ns, id})) {
        return;
    }
    it->second.ends.erase({end_ns, id});
    --_impl->intervals;
    if (it->second.starts.empty()) {
        _impl->by_tenant.erase(it);  // bounded by the tenants holding something
    }
}

void booked_time::clear() noexcept {
    _impl->by_tenant.clear();
    _impl->intervals = 0;
}

std::int64_t booked_time::within(std::string_view tenant, std::int64_t from_ns,
                                 std::int64_t until_ns) const {
    const auto it = _impl->by_tenant.find(tenant);
    if (it == _impl->by_tenant.end() || until_ns <= from_ns) {
        return 0;
    }
    // Each interval's time inside the window is clamp(end) - clamp(start).
    const std::uint64_t ends = clamped_sum(it->second.ends, from_ns, until_ns);
    const std::uint64_t starts = clamped_sum(it->second.starts, from_ns, until_ns);
    return static_cast<std::int64_t>(ends - starts);
}

std::size_t booked_time::intervals() const noexcept { return _impl->intervals; }

std::size_t booked_time::tenants() const noexcept { return _impl->by_tenant.size(); }

}  // namespace qrt::timeline
