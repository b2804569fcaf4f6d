// Recent windows of the telemetry histograms: see qrt/telemetry.hpp.

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "qrt/telemetry.hpp"

namespace qrt::telemetry {

namespace {

using hist = rtcore::histogram;

// The non-empty buckets of a histogram (index, count), lowest first.
struct checkpoint {
    std::int64_t t_ns = 0;
    std::uint64_t count = 0;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> buckets;
};

checkpoint checkpoint_of(const hist& h, std::int64_t t_ns) {
    checkpoint c;
    c.t_ns = t_ns;
    c.count = h.count();
    h.for_each_bucket([&](const rtcore::histogram_bucket& b) {
        c.buckets.emplace_back(static_cast<std::uint32_t>(hist::bucket_index(b.lower_ns)), b.count);
    });
    return c;
}

// now - base, bucket by bucket, at bucket midpoints clamped to now's range.
hist difference(const hist& now, const checkpoint& base) {
    hist out;
    if (now.count() < base.count) {
        return out;  // never: a reset is caught before
    }
    auto it = base.buckets.begin();
    now.for_each_bucket([&](const rtcore::histogram_bucket& b) {
        const auto index = static_cast<std::uint32_t>(hist::bucket_index(b.lower_ns));
        while (it != base.buckets.end() && it->first < index) {
            ++it;
        }
        const std::uint64_t earlier = (it != base.buckets.end() && it->first == index) ? it->second : 0;
        if (b.count > earlier) {
            const std::int64_t v = std::clamp(hist::bucket_midpoint(index), std::max(b.lower_ns, now.min()),
                                              std::min(b.upper_ns, now.max()));
            out.record_n(v, b.count - earlier);
        }
    });
    return out;
}

std::string key_of(const histogram& h) {
    std::string k = h.name;
    for (const auto& [name, value] : h.label_set) {
        k += '\x1f';
        k += name;
        k += '=';
        k += value;
    }
    return k;
}

}  // namespace

struct recent_windows::state {
    struct series {
        std::int64_t last_seen_ns = 0;
        std::vector<std::deque<checkpoint>> rings;  // one per spec
    };
    std::map<std::string, series, std::less<>> by_key;
};

std::vector<recent_window_spec> recent_windows::default_specs() {
    return {{"1m", 60'000'000'000, 6}, {"1h", 3'600'000'000'000, 6}};
}

recent_windows::recent_windows(std::vector<recent_window_spec> specs, std::size_t max_series)
    : _specs(std::move(specs)), _max_series(max_series), _state(std::make_unique<state>()) {
    for (auto& s : _specs) {
        s.slices = std::max<std::size_t>(s.slices, 1);
        s.length_ns = std::max<std::int64_t>(s.length_ns, 1);
    }
}

recent_windows::~recent_windows() = default;
recent_windows::recent_windows(recent_windows&&) noexcept = default;
recent_windows& recent_windows::operator=(recent_windows&&) noexcept = default;

std::int64_t recent_windows::tick_ns() const noexcept {
    std::int64_t t = INT64_MAX;
    for (const auto& s : _specs) {
        t = std::min(t, s.length_ns / static_cast<std::int64_t>(s.slices));
    }
    return std::max<std::int64_t>(t, 1);
}

std::size_t recent_windows::series() const noexcept { return _state->by_key.size(); }

void recent_windows::observe(const snapshot& s, std::int64_t now_ns) {
    std::int64_t longest = 0;
    for (const auto& spec : _specs) {
        longest = std::max(longest, spec.length_ns);
    }
    for (const auto& h : s.histograms) {
        if (!h.ns) {
            continue;
        }
        const std::string key = key_of(h);
        auto it = _state->by_key.find(key);
        if (it == _state->by_key.end()) {
            if (_state->by_key.size() >= _max_series) {
                continue;
            }
            it = _state->by_key.emplace(key, state::series{}).first;
            it->second.rings.resize(_specs.size());
        }
        auto& ser = it->second;
        ser.last_seen_ns = now_ns;
        for (std::size_t w = 0; w < _specs.size(); ++w) {
            auto& ring = ser.rings[w];
            const auto& spec = _specs[w];
            // A reset (the count went back): start again from here.
            if (!ring.empty() && h.ns->count() < ring.back().count) {
                ring.clear();
                ring.push_back(checkpoint{now_ns, 0, {}});  // everything since is recent
                continue;
            }
            const std::int64_t slice = spec.length_ns / static_cast<std::int64_t>(spec.slices);
            if (ring.empty() || now_ns - ring.back().t_ns >= slice) {
                ring.push_back(checkpoint_of(*h.ns, now_ns));
                while (ring.size() > spec.slices + 1) {
                    ring.pop_front();
                }
            }
        }
    }
    // Series gone for the longest window are forgotten.
    std::erase_if(_state->by_key, [&](const auto& kv) { return now_ns - kv.second.last_seen_ns > longest; });
}

void recent_windows::annotate(snapshot& s, std::int64_t now_ns) {
    for (auto& h : s.histograms) {
        if (!h.ns) {
            continue;
        }
        auto it = _state->by_key.find(key_of(h));
        if (it == _state->by_key.end()) {
            if (_state->by_key.size() >= _max_series) {
                continue;
            }
            // First seen here: its windows count from now.
            it = _state->by_key.emplace(key_of(h), state::series{}).first;
            it->second.last_seen_ns = now_ns;
            for (std::size_t w = 0; w < _specs.size(); ++w) {
                it->second.rings.emplace_back();
                it->second.rings.back().push_back(checkpoint_of(*h.ns, now_ns));
            }
        }
        h.recent.clear();
        for (std::size_t w = 0; w < _specs.size(); ++w) {
            const auto& ring = it->second.rings[w];
            if (ring.empty()) {
                continue;
            }
            // The newest checkpoint at least `length` old, else the oldest.
            const checkpoint* base = &ring.front();
            for (const auto& c : ring) {
                if (now_ns - c.t_ns >= _specs[w].length_ns) {
                    base = &c;
                }
            }
            window_view v;
            v.window = _specs[w].name;
            v.span_ns = std::max<std::int64_t>(0, now_ns - base->t_ns);
            v.ns = std::make_shared<const hist>(h.ns->count() < base->count ? hist{} : difference(*h.ns, *base));
            h.recent.push_back(std::move(v));
        }
    }
}

std::string recent_metric_name(std::string_view histogram_name) {
    constexpr std::string_view unit = "_seconds";
    if (histogram_name.size() > unit.size() && histogram_name.ends_with(unit)) {
        return std::string(histogram_name.substr(0, histogram_name.size() - unit.size())) + "_recent_seconds";
    }
    return std::string(histogram_name) + "_recent";
}

std::string recent_samples_metric_name(std::string_view histogram_name) {
    constexpr std::string_view unit = "_seconds";
    if (histogram_name.size() > unit.size() && histogram_name.ends_with(unit)) {
        return std::string(histogram_name.substr(0, histogram_name.size() - unit.size())) + "_recent_samples";
    }
    return std::string(histogram_name) + "_recent_samples";
}

}  // namespace qrt::telemetry
