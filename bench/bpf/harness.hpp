#pragma once
// Shared bits of the bpf/ harnesses: percentiles, hypervisor steal, the
// periodic wakeup loop and the final JSON line.

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "rtcore/clock.hpp"

namespace qrt_bench {

inline double percentile(std::vector<double> v, double q) {
    if (v.empty()) {
        return 0.0;
    }
    std::sort(v.begin(), v.end());
    const double pos = q * static_cast<double>(v.size() - 1);
    const auto lo = static_cast<std::size_t>(std::floor(pos));
    const auto hi = static_cast<std::size_t>(std::ceil(pos));
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// Aggregate "cpu" line of /proc/stat: (steal, total) in jiffies.
inline std::pair<std::uint64_t, std::uint64_t> read_steal() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    in >> cpu;
    std::uint64_t v = 0, total = 0, steal = 0;
    for (int i = 0; i < 10 && (in >> v); ++i) {
        total += v;
        if (i == 7) {
            steal = v;
        }
    }
    return {steal, total};
}

struct steal_meter {
    std::pair<std::uint64_t, std::uint64_t> start = read_steal();
    double percent() const {
        const auto now = read_steal();
        const double dt = static_cast<double>(now.second - start.second);
        return dt > 0 ? 100.0 * static_cast<double>(now.first - start.first) / dt : 0.0;
    }
};

inline bool pin_to(unsigned cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return ::sched_setaffinity(0, sizeof(set), &set) == 0;
}

inline bool set_fifo(int prio) {
    sched_param sp{};
    sp.sched_priority = prio;
    return ::sched_setscheduler(0, SCHED_FIFO, &sp) == 0;
}

// cyclictest-style loop: sleep to absolute T (clock_nanosleep TIMER_ABSTIME),
// lateness = clock_gettime after waking - T.  Returns lateness in ns.
inline std::vector<double> periodic_loop(int loops, std::int64_t period_ns) {
    std::vector<double> late;
    late.reserve(static_cast<std::size_t>(loops));
    std::int64_t next = rtcore::monotonic_now_ns() + period_ns;
    for (int i = 0; i < loops; ++i) {
        timespec ts{static_cast<time_t>(next / 1'000'000'000), static_cast<long>(next % 1'000'000'000)};
        ::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
        late.push_back(static_cast<double>(rtcore::monotonic_now_ns() - next));
        next += period_ns;
    }
    return late;
}

// One flat JSON object on one line: numbers and strings only.
class json_line {
public:
    json_line& num(const std::string& key, double v) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.6g", std::isfinite(v) ? v : 0.0);
        _fields.emplace_back(key, buf);
        return *this;
    }
    json_line& str(const std::string& key, const std::string& v) {
        std::string q = "\"";
        for (char c : v) {
            if (c == '"' || c == '\\') {
                q += '\\';
            }
            q += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
        }
        _fields.emplace_back(key, q + "\"");
        return *this;
    }
    json_line& boolean(const std::string& key, bool v) {
        _fields.emplace_back(key, v ? "true" : "false");
        return *this;
    }
    std::string render() const {
        std::string s = "{";
        for (std::size_t i = 0; i < _fields.size(); ++i) {
            s += (i ? "," : "") + ("\"" + _fields[i].first + "\":") + _fields[i].second;
        }
        return s + "}";
    }

private:
    std::vector<std::pair<std::string, std::string>> _fields;
};

}  // namespace qrt_bench
