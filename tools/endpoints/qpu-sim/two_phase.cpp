// qpu-sim's version-2 side (two_phase.hpp).
#include "two_phase.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "rtcore/clock.hpp"

namespace qpu_sim {

namespace wire = qrt::wire;

std::uint64_t splitmix64(std::uint64_t& s) {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

std::string bitstring_counts(std::uint64_t job_id, std::uint64_t calibration_id, std::uint32_t shots,
                             unsigned qubits) {
    const std::size_t outcomes = std::size_t{1} << qubits;
    std::vector<std::uint32_t> counts(outcomes, 0);
    std::uint64_t seed = job_id * 0x100000001b3ULL ^ calibration_id;
    // Biased towards |0...0> and |1...1>, as a GHZ-like program would be.
    for (std::uint32_t i = 0; i < shots; ++i) {
        const std::uint64_t r = splitmix64(seed);
        std::size_t k = 0;
        if ((r & 0xff) < 200) {
            k = ((r >> 8) & 1) != 0 ? outcomes - 1 : 0;
        } else {
            k = static_cast<std::size_t>((r >> 16) % outcomes);
        }
        ++counts[k];
    }
    std::string out;
    for (std::size_t k = 0; k < outcomes; ++k) {
        if (counts[k] == 0) {
            continue;
        }
        for (unsigned b = qubits; b-- > 0;) {
            out.push_back(((k >> b) & 1) != 0 ? '1' : '0');
        }
        out += ' ';
        out += std::to_string(counts[k]);
        out += '\n';
    }
    return out;
}

bool parse_dist(const std::string& text, prepare_model::dist& out) {
    if (text == "fixed") {
        out = prepare_model::dist::fixed;
    } else if (text == "uniform") {
        out = prepare_model::dist::uniform;
    } else if (text == "exponential") {
        out = prepare_model::dist::exponential;
    } else {
        return false;
    }
    return true;
}

wire::armed_cost prepare_model::draw(std::uint64_t job_id, std::size_t payload_bytes) const {
    std::uint64_t seed = job_id ^ 0x5bd1e995ULL;
    const double u = static_cast<double>(splitmix64(seed) >> 11) * 0x1.0p-53;  // [0, 1)
    double base = base_ms;
    switch (shape) {
    case dist::fixed: break;
    case dist::uniform: base += spread_ms * (2 * u - 1); break;
    case dist::exponential: base += -spread_ms * std::log1p(-u); break;
    }
    const auto base_ns = static_cast<std::int64_t>(std::max(0.0, base) * 1e6);
    const auto bytes_ns = static_cast<std::int64_t>(ns_per_byte * static_cast<double>(payload_bytes));
    wire::armed_cost c;
    c.by_stage[QRT_WIRE_STAGE_COMPILE] = base_ns / 2;
    c.by_stage[QRT_WIRE_STAGE_ARM] = base_ns / 10;
    c.by_stage[QRT_WIRE_STAGE_UPLOAD] = base_ns - base_ns / 2 - base_ns / 10 + bytes_ns;
    return c;
}

std::int64_t prepare_model::bound_ns() const {
    double base = base_ms;
    if (shape == dist::uniform) {
        base += spread_ms;
    } else if (shape == dist::exponential) {
        base += 5 * spread_ms;
    }
    return static_cast<std::int64_t>(base * 1e6 + ns_per_byte * static_cast<double>(wire::max_payload));
}

two_phase::two_phase(two_phase_options opt, send_fn send, schedule_fn schedule, std::int64_t& busy_until_mono,
                     rtcore::histogram& start_lateness)
    : _opt(std::move(opt)),
      _send(std::move(send)),
      _schedule(std::move(schedule)),
      _busy_until_mono(busy_until_mono),
      _start_lateness(start_lateness) {}

std::string two_phase::capabilities(const std::string& identity, const std::string& session) const {
    wire::capabilities c;
    c.identity = identity;
    c.two_phase = true;
    c.max_armed = _opt.max_armed;
    c.horizon_ns = _opt.horizon_ns;
    c.min_lead_ns = _opt.min_lead_ns >= 0 ? _opt.min_lead_ns : _opt.prepare.bound_ns();
    c.session = session;
    return wire::capabilities_json(c);
}

void two_phase::error(std::uint64_t control, const wire::header& about, qrt_wire_error status, qrt_wire_stage stage,
                      std::int64_t arrival_ns, const std::string& why) {
    wire::header_v2 h = wire::header_v2_for(about, wire::frame_type::error);
    h.v1.status = static_cast<std::uint16_t>(status);
    h.v1.arrival_ns = arrival_ns;
    h.v1.sent_ns = rtcore::realtime_now_ns();
    h.stage = static_cast<std::uint8_t>(stage);
    _send(control, wire::encode_frame(h, why));
}

void two_phase::on_arm(std::uint64_t control, const wire::frame& f, std::int64_t arrival_ns,
                       std::int64_t arrival_mono) {
    ++_arms;
    const wire::header& a = f.hdr;
    if (_held.count(a.job_id) != 0) {
        ++_arm_refused;
        error(control, a, QRT_WIRE_ERR_PROGRAM_REFUSED, QRT_WIRE_STAGE_PARSE, arrival_ns,
              "job " + std::to_string(a.job_id) + " is already armed here");
        return;
    }
    if (_held.size() >= _opt.max_armed) {
        ++_arm_refused;
        error(control, a, QRT_WIRE_ERR_TOO_MANY_ARMED, QRT_WIRE_STAGE_ARM, arrival_ns,
              std::to_string(_held.size()) + " jobs held (max_armed " + std::to_string(_opt.max_armed) + ")");
        return;
    }
    if (a.scheduled_ns - arrival_ns > _opt.horizon_ns) {
        ++_arm_refused;
        error(control, a, QRT_WIRE_ERR_PROGRAM_REFUSED, QRT_WIRE_STAGE_ARM, arrival_ns,
              "fire_at is " + std::to_string(a.scheduled_ns - arrival_ns) + " ns ahead, beyond the horizon " +
                  std::to_string(_opt.horizon_ns) + " ns");
        return;
    }
    if (!_opt.refuse_marker.empty()) {
        const std::string_view text = f.payload_text();
        const auto at = text.find(_opt.refuse_marker);
        if (at != std::string_view::npos) {
            ++_arm_refused;
            const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
            error(control, a, QRT_WIRE_ERR_PROGRAM_REFUSED, QRT_WIRE_STAGE_PARSE, arrival_ns,
                  "line " + std::to_string(line) + ": \"" + _opt.refuse_marker + "\" is not a gate of qpu-sim");
            return;
        }
    }
    if (_opt.calibration_id != 0 && a.calibration_id != _opt.calibration_id) {
        ++_arm_refused;
        error(control, a, QRT_WIRE_ERR_CALIBRATION_UNKNOWN, QRT_WIRE_STAGE_COMPILE, arrival_ns,
              "calibration_id " + std::to_string(a.calibration_id) + " is not held here (current " +
                  std::to_string(_opt.calibration_id) + ")");
        return;
    }
    held h;
    h.control = control;
    h.arm = a;
    h.arm.arrival_ns = arrival_ns;
    h.cost = _opt.prepare.draw(a.job_id, f.payload.size());
    const std::int64_t start = std::max(arrival_mono, _prepare_free_mono);
    h.armed_at_mono = start + h.cost.total_ns();
    h.armed_at_ns = arrival_ns + (h.armed_at_mono - arrival_mono);
    _prepare_free_mono = h.armed_at_mono;
    _arm_cost.record(h.cost.total_ns());
    _held.emplace(a.job_id, std::move(h));
    _max_held = std::max<std::uint64_t>(_max_held, _held.size());
}

void two_phase::tick(std::int64_t now_mono) {
    for (auto& [id, h] : _held) {
        if (h.announced || h.armed_at_mono > now_mono) {
            continue;
        }
        h.announced = true;
        ++_armed;
        wire::header_v2 r = wire::header_v2_for(h.arm, wire::frame_type::armed);
        r.armed_ns = h.armed_at_ns;
        r.v1.arrival_ns = h.arm.arrival_ns;
        r.v1.sent_ns = rtcore::realtime_now_ns();
        _send(h.control, wire::encode_frame(r, wire::armed_json(h.cost)));
    }
}

std::int64_t two_phase::next_due() const {
    std::int64_t due = INT64_MAX;
    for (const auto& [id, h] : _held) {
        if (!h.announced) {
            due = std::min(due, h.armed_at_mono);
        }
    }
    return due;
}

void two_phase::on_disarm(std::uint64_t control, const wire::frame& f, std::int64_t arrival_ns) {
    ++_disarms;
    auto it = _held.find(f.hdr.job_id);
    if (it == _held.end() || it->second.control != control) {
        ++_disarm_unknown;
        error(control, f.hdr, QRT_WIRE_ERR_NOT_ARMED, QRT_WIRE_STAGE_NONE, arrival_ns,
              "job " + std::to_string(f.hdr.job_id) + " is not armed here");
        return;
    }
    wire::header_v2 r = wire::header_v2_for(it->second.arm, wire::frame_type::disarmed);
    r.armed_ns = it->second.announced ? it->second.armed_at_ns : 0;
    r.v1.arrival_ns = arrival_ns;
    r.v1.sent_ns = rtcore::realtime_now_ns();
    _held.erase(it);
    ++_disarmed;
    _send(control, wire::encode_frame(r, std::string_view{}));
}

void two_phase::on_fire(std::uint64_t control, const wire::frame& f, std::int64_t arrival_ns,
                        std::int64_t arrival_mono) {
    ++_fires;
    _fire_lateness.record(arrival_ns - f.hdr.scheduled_ns);
    auto it = _held.find(f.hdr.job_id);
    if (it == _held.end() || it->second.control != control || !it->second.announced) {
        ++_fired_unarmed;
        error(control, f.hdr, QRT_WIRE_ERR_NOT_ARMED, QRT_WIRE_STAGE_FIRE, arrival_ns,
              "FIRE for job " + std::to_string(f.hdr.job_id) +
                  (it == _held.end() ? ", which is not armed here" : ", whose prepare has not ended"));
        if (it != _held.end() && it->second.control == control) {
            _held.erase(it);  // its slot is gone: never started
        }
        return;
    }
    held h = std::move(it->second);
    _held.erase(it);
    const wire::header& job = h.arm;
    if (job.calibration_id != f.hdr.calibration_id) {
        ++_fire_calibration;
        error(control, job, QRT_WIRE_ERR_CALIBRATION, QRT_WIRE_STAGE_FIRE, arrival_ns,
              "FIRE names calibration " + std::to_string(f.hdr.calibration_id) + "; the job was armed with " +
                  std::to_string(job.calibration_id) + ": not started");
        return;
    }
    if (arrival_ns < job.window_start_ns || arrival_ns + job.duration_ns > job.window_end_ns) {
        ++_fire_out_of_window;
        error(control, job, QRT_WIRE_ERR_OUT_OF_WINDOW, QRT_WIRE_STAGE_FIRE, arrival_ns,
              "FIRE arrival " + std::to_string(arrival_ns) + " outside window [" + std::to_string(job.window_start_ns) +
                  ", " + std::to_string(job.window_end_ns) + " - duration " + std::to_string(job.duration_ns) +
                  "]: not started");
        return;
    }
    const std::int64_t start_mono = std::max(arrival_mono, _busy_until_mono);
    _busy_until_mono = start_mono + std::max<std::int64_t>(job.duration_ns, 0);
    const std::int64_t started_ns = arrival_ns + (start_mono - arrival_mono);
    _start_lateness.record(started_ns - job.scheduled_ns);
    wire::header_v2 r = wire::header_v2_for(job, wire::frame_type::result);
    r.v1.arrival_ns = arrival_ns;
    r.armed_ns = h.armed_at_ns;
    r.started_ns = started_ns;
    r.ended_ns = started_ns + std::max<std::int64_t>(job.duration_ns, 0);
    if (job.tolerance_ns > 0 && arrival_ns - job.scheduled_ns > job.tolerance_ns) {
        r.v1.flags |= QRT_WIRE_FLAG_LATE;
    }
    r.v1.sent_ns = r.ended_ns;
    const std::string data = (job.flags & QRT_WIRE_FLAG_NO_RESULT_DATA) != 0
                                 ? std::string()
                                 : bitstring_counts(job.job_id, job.calibration_id,
                                                    std::min<std::uint32_t>(job.shots, 1'000'000), _opt.qubits);
    ++_results;
    _schedule(_busy_until_mono, control, wire::encode_frame(r, data));
}

void two_phase::on_control_closed(std::uint64_t control) {
    for (auto it = _held.begin(); it != _held.end();) {
        if (it->second.control == control) {
            ++_dropped_armed;
            it = _held.erase(it);
        } else {
            ++it;
        }
    }
}

namespace {
nlohmann::json summary_json(const rtcore::histogram& h) {
    const rtcore::histogram_summary s = h.summary();
    return {{"count", s.count}, {"p50", s.p50_ns}, {"p95", s.p95_ns}, {"p99", s.p99_ns},
            {"p999", s.p999_ns}, {"max", s.max_ns}, {"min", s.min_ns}, {"mean", s.mean_ns}};
}
}  // namespace

void two_phase::report(nlohmann::json& j) const {
    j["two_phase"] = {
        {"arms", _arms},
        {"armed", _armed},
        {"arm_refused", _arm_refused},
        {"fires", _fires},
        {"fired_unarmed", _fired_unarmed},
        {"fire_out_of_window", _fire_out_of_window},
        {"fire_calibration_mismatch", _fire_calibration},
        {"disarms", _disarms},
        {"disarmed", _disarmed},
        {"disarm_unknown", _disarm_unknown},
        {"dropped_armed", _dropped_armed},
        {"max_held", _max_held},
        {"held_at_exit", _held.size()},
        {"results", _results},
        {"arm_cost_ns", summary_json(_arm_cost)},
        {"fire_lateness_ns", summary_json(_fire_lateness)},
    };
}

}  // namespace qpu_sim
