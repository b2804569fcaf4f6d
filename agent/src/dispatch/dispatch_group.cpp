// The dispatch thread and its loop (dispatch_group.hpp): the one owner, for
// a lone QPU (a group of one, dispatcher::start) as for several QPUs on one
// CPU.  The loop runs each member's own RT steps (pull_jobs, drop_withdrawn,
// follow_realtime_step, reap_completions, emit, check_placement, send_head:
// dispatcher_rt.cpp) and chooses the next job across the members.

#include "qrt/dispatch/dispatch_group.hpp"

#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <initializer_list>
#include <stdexcept>
#include <tuple>

#include "dispatcher_internal.hpp"
#include "qrt/dispatch/guard.hpp"
#include "qrt/proto/wire_codec.hpp"
#include "rtcore/cpu_dma_latency.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/memory_lock.hpp"
#include "rtcore/rt_thread.hpp"

namespace qrt::dispatch {

namespace {

using detail::spin_to;

using detail::adapt_guard_ns;
using detail::endpoint_update_guard_ns;

std::string qpu_name(const dispatcher& d) { return "qpu " + std::to_string(d.config().qpu_index); }

}  // namespace

dispatch_group::dispatch_group(std::vector<dispatcher*> members)
    : _members(std::move(members)),
      _clock(_members.empty() || _members.front() == nullptr ? throw std::invalid_argument("dispatch group: no members")
                                                             : _members.front()->_clock) {
    if (_members.size() > max_members) {
        throw std::invalid_argument("dispatch group: " + std::to_string(_members.size()) +
                                    " QPUs on one dispatch thread, at most " + std::to_string(max_members));
    }
    const dispatcher_config& first = _members.front()->config();
    for (dispatcher* m : _members) {
        if (m == nullptr) {
            throw std::invalid_argument("dispatch group: a null member");
        }
        const dispatcher_config& c = m->config();
        const std::string who = "dispatch group: " + qpu_name(*m);
        if (m->running() || m->_group != nullptr) {
            throw std::invalid_argument(who + " already has a thread or a group");
        }
        if (&m->_clock != &_clock) {
            throw std::invalid_argument(who + " uses another clock than " + qpu_name(*_members.front()));
        }
        if (c.mode != first.mode || c.dispatch_cpu != first.dispatch_cpu || c.rt_priority != first.rt_priority ||
            c.require_rt != first.require_rt || c.hold_cpu_dma_latency != first.hold_cpu_dma_latency) {
            throw std::invalid_argument(who + " differs from " + qpu_name(*_members.front()) +
                                        " in mode, dispatch_cpu, rt_priority, require_rt or "
                                        "hold_cpu_dma_latency: one thread serves them all");
        }
        if (m->effective_submit_mode() != submit_mode::syscall && _members.size() > 1) {
            throw std::invalid_argument(who + " uses sqpoll submission; QPUs sharing a dispatch thread use "
                                              "dispatch.submit_mode = \"syscall\"");
        }
    }
    _loop_state = std::make_unique<member_loop[]>(_members.size());
    for (dispatcher* m : _members) {
        m->_group = this;
        m->_wakeup = &_wake;
    }
}

dispatch_group::~dispatch_group() {
    stop();
    for (dispatcher* m : _members) {
        m->_group = nullptr;
        m->_wakeup = &m->_wake;
    }
}

rtcore::status dispatch_group::start() {
    if (_thread.joinable()) {
        return rtcore::error::invalid("dispatch group on cpu " + std::to_string(dispatch_cpu()) + ": already running");
    }
    _stop.store(false, std::memory_order_release);
    _setup_done.store(0, std::memory_order_release);
    _thread = std::thread([this] { thread_main(); });
    for (int i = 0; i < 5000 && _setup_done.load(std::memory_order_acquire) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const int st = _setup_done.load(std::memory_order_acquire);
    if (st < 0 && _members.front()->config().require_rt) {
        stop();
        const std::string who = _members.size() == 1
                                    ? "dispatch: " + qpu_name(*_members.front())
                                    : "dispatch group of " + std::to_string(_members.size()) + " QPUs";
        return rtcore::error{-st, who + ": real-time setup of the dispatch thread: " + _setup_error};
    }
    return rtcore::ok();
}

void dispatch_group::stop() noexcept {
    if (!_thread.joinable()) {
        return;
    }
    _stop.store(true, std::memory_order_release);
    rtcore::wake_sleepers(_wake);
    _thread.join();
}

void dispatch_group::thread_main() noexcept {
    // Setup (may allocate), as dispatcher::thread_main, once for the thread
    // and the memory locks once per member.
    detail::begin_dispatch_thread();
    const dispatcher_config& cfg = _members.front()->config();
    std::optional<rtcore::scoped_rt_thread> rt;
    rtcore::cpu_dma_latency_hold dma;
    int setup_err = 0;
    try {
        if (cfg.mode == dispatch_mode::tuned) {
            auto entered = detail::enter_tuned(cfg, [this] {
                // In the isolated cpuset now, still SCHED_OTHER: a group of
                // one may set its SQPOLL ring up here (SQ_AFF was refused
                // outside the cpuset).
                if (dispatcher& only = *_members.front(); _members.size() == 1 && only._sqpoll_retry_on_thread) {
                    only.retry_sqpoll_on_this_thread();
                }
            });
            if (entered) {
                rt.emplace(std::move(*entered));
                for (dispatcher* m : _members) {
                    m->_st_rt.store(true, std::memory_order_relaxed);
                    if (setup_err != 0) {
                        continue;
                    }
                    if (auto st = m->lock_dispatch_path(rtcore::rt_thread_config{}.prefault_stack_bytes); st) {
                        m->_st_mlocked.store(true, std::memory_order_relaxed);
                    } else {
                        setup_err = st.err().code != 0 ? st.err().code : EPERM;
                        _setup_error = (_members.size() > 1 ? qpu_name(*m) + ": " : std::string()) + st.err().message;
                    }
                }
                // The group's own state the loop reads: this object and
                // its two arrays.
                for (const auto& [p, n, what] :
                     std::initializer_list<std::tuple<const void*, std::size_t, const char*>>{
                         {this, sizeof *this, "dispatch group"},
                         {_members.data(), _members.size() * sizeof(dispatcher*), "group members"},
                         {_loop_state.get(), _members.size() * sizeof(member_loop), "group loop state"}}) {
                    if (setup_err != 0) {
                        break;
                    }
                    auto r = rtcore::lock_region(p, n, what);
                    if (!r) {
                        setup_err = r.err().code != 0 ? r.err().code : EPERM;
                        _setup_error = r.err().message;
                    } else {
                        _locked.push_back(std::move(*r));
                    }
                }
            } else {
                setup_err = entered.err().code != 0 ? entered.err().code : EPERM;
                _setup_error = entered.err().message;
            }
            if (cfg.hold_cpu_dma_latency) {
                rtcore::host_fs fs = rtcore::host_fs::system();
                auto h = rtcore::cpu_dma_latency_hold::acquire(fs, 0);
                if (h) {
                    dma = std::move(*h);
                } else if (setup_err == 0 && !cfg.require_rt) {
                    setup_err = h.err().code != 0 ? h.err().code : EPERM;
                    _setup_error = h.err().message;
                }
            }
        }
    } catch (...) {
        setup_err = ENOMEM;
    }
    const bool will_run = setup_err == 0 || !cfg.require_rt;
    for (dispatcher* m : _members) {
        m->_st_dma.store(dma.active(), std::memory_order_relaxed);
        m->_st_setup_errno.store(setup_err, std::memory_order_relaxed);
        if (setup_err != 0) {
            m->_setup_error = _setup_error;
        }
        // Running before start() returns: a set_endpoint_fd() right after
        // it must hand the fd over, not take the ring lock itself.
        m->_loop_running.store(will_run, std::memory_order_release);
    }
    _setup_done.store(setup_err == 0 ? 1 : -setup_err, std::memory_order_release);
    if (!will_run) {
        return;
    }
    const std::int64_t now = _clock.now_monotonic_ns();
    for (dispatcher* m : _members) {
        m->check_placement(now, true);
    }
    run_loop();
    for (dispatcher* m : _members) {
        m->_loop_running.store(false, std::memory_order_release);
        m->_locked.clear();
        m->_st_locked_bytes.store(0, std::memory_order_relaxed);
    }
    _locked.clear();
}

std::int64_t dispatch_group::look(std::size_t i, std::int64_t now) noexcept {
    dispatcher& m = *_members[i];
    member_loop& ml = _loop_state[i];
    m._st_loops.fetch_add(1, std::memory_order_relaxed);
    m.reap_completions();
    m.submit_leftovers();
    const std::uint32_t withdrawals = m._withdrawals.load(std::memory_order_acquire);
    m.pull_jobs();
    if (withdrawals != ml.withdrawals_seen) {
        ml.withdrawals_seen = withdrawals;
        m.drop_withdrawn(now);
    }
    // Missed heads and a step: bounded by the pending jobs (each pass pops
    // one, or re-converts once and then finds the offsets consistent).
    for (std::size_t guard = 0; guard <= 2 * m._slot_count + 2; ++guard) {
        const dispatcher::queued_job* j = m.pending_head();
        if (j == nullptr) {
            return INT64_MAX;
        }
        const std::int64_t deadline = m._slots[j->slot].deadline_ns.load(std::memory_order_acquire);
        if (m.follow_realtime_step(*j, deadline)) {
            continue;
        }
        if (now - deadline > j->tolerance_ns) {
            m.emit(*j, dispatch_status::missed, deadline, now, -1, 0);
            m.pending_pop();
            continue;
        }
        return deadline;
    }
    const dispatcher::queued_job* j = m.pending_head();
    return j == nullptr ? INT64_MAX : m._slots[j->slot].deadline_ns.load(std::memory_order_acquire);
}

void dispatch_group::run_loop() noexcept {
    const std::size_t n = _members.size();
    const bool tuned = _members.front()->config().mode == dispatch_mode::tuned;
    const dispatcher_config& cfg = _members.front()->config();
    while (true) {
        const std::uint32_t seen = _wake.load(std::memory_order_acquire);
        if (_stop.load(std::memory_order_acquire)) {
            break;
        }
        std::int64_t now = _clock.now_monotonic_ns();
        // The earliest start T (realtime, as the jobs were placed: each
        // member converts with its own time base, sampled a few hundred ns
        // apart, so equal starts may differ by that in monotonic time).
        std::size_t best = n;
        std::int64_t best_deadline = INT64_MAX;
        std::int64_t best_start = INT64_MAX;
        for (std::size_t i = 0; i < n; ++i) {
            const std::int64_t d = look(i, now);
            const dispatcher::queued_job* head = _members[i]->pending_head();
            if (d == INT64_MAX || head == nullptr) {
                continue;
            }
            const std::int64_t start = head->scheduled_rt_ns;
            if (start < best_start) {  // strict: equal starts go to the earlier member
                best_start = start;
                best_deadline = d;
                best = i;
            }
        }
        // Endpoint registrations (io_uring_register: microseconds) only when
        // no member's send is close, or the member's endpoint is down (then
        // it sends nothing anyway).
        for (std::size_t i = 0; i < n; ++i) {
            dispatcher& m = *_members[i];
            if (m._fd_req_gen.load(std::memory_order_acquire) == m._fd_done_gen.load(std::memory_order_relaxed)) {
                continue;
            }
            const bool close = best < n && best_deadline - now <= _members[best]->_lead.lead_ns() +
                                                                       endpoint_update_guard_ns;
            if (!close || !m._endpoint_up.load(std::memory_order_acquire)) {
                m.apply_endpoint_update(now, nullptr);
            }
        }
        if (best == n) {
            bool arrived = false;
            for (dispatcher* m : _members) {
                m->check_placement(now, false);
                m->_idle.store(true, std::memory_order_relaxed);
            }
            std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with submit()'s fence
            for (dispatcher* m : _members) {
                arrived = arrived || m->_jobs.peek() != nullptr;
            }
            if (!arrived && _clock.sleep_until_or_woken(now + cfg.idle_sleep_ns, _wake, seen) == -EAGAIN) {
                _members.front()->_st_early_wakes.fetch_add(1, std::memory_order_relaxed);
            }
            for (dispatcher* m : _members) {
                m->_idle.store(false, std::memory_order_relaxed);
            }
            continue;
        }
        dispatcher& m = *_members[best];
        member_loop& ml = _loop_state[best];
        const dispatcher::queued_job* j = m.pending_head();
        if (j == nullptr) {  // cannot happen: look() found its head
            continue;
        }
        dispatcher::slot_state& s = m._slots[j->slot];
        const std::int64_t deadline = best_deadline;
        if (j->slot != ml.cur_slot) {
            ml.cur_slot = j->slot;
            ml.first_seen = now;
        }
        std::int64_t lead = tuned ? m._lead.lead_ns() : 0;
        const auto budget =
            static_cast<std::int64_t>(static_cast<double>(deadline - ml.first_seen) * m._cfg.max_spin_fraction);
        if (lead > budget) {
            lead = std::max<std::int64_t>(budget, 0);
            m._st_lead_capped.fetch_add(1, std::memory_order_relaxed);
        }
        const std::int64_t wake = deadline - lead;
        std::int64_t wakeup_latency = -1;
        if (now < wake) {
            const bool chunk = wake - now > cfg.max_sleep_chunk_ns;
            const std::int64_t target = chunk ? now + cfg.max_sleep_chunk_ns : wake;
            // A member with nothing pending is idle: a job handed to it
            // (maybe earlier than this one) wakes the thread.
            bool arrived = false;
            for (dispatcher* o : _members) {
                o->_idle.store(o->pending_head() == nullptr, std::memory_order_relaxed);
            }
            std::atomic_thread_fence(std::memory_order_seq_cst);
            for (dispatcher* o : _members) {
                arrived = arrived || (o->pending_head() == nullptr && o->_jobs.peek() != nullptr);
            }
            int rc = -EAGAIN;
            if (!arrived) {
                if (!chunk) {
                    m.prewake_poller();  // sqpoll (a group of one): awake at T, no syscall to send
                }
                rc = _clock.sleep_until_or_woken(target, _wake, seen);
                m._st_sleeps.fetch_add(1, std::memory_order_relaxed);
            }
            for (dispatcher* o : _members) {
                o->_idle.store(false, std::memory_order_relaxed);
            }
            if (rc == -EAGAIN) {
                m._st_early_wakes.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            if (chunk) {
                continue;
            }
            now = _clock.now_monotonic_ns();
            if (s.deadline_ns.load(std::memory_order_acquire) != deadline) {
                m._st_reloads.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            if (m.follow_realtime_step(*j, deadline)) {
                continue;
            }
            wakeup_latency = now - target;
            if (tuned) {
                m._lead.observe(wakeup_latency);
                m._lead_ns_pub.store(m._lead.lead_ns(), std::memory_order_relaxed);
            }
        }
        std::int64_t spin_ns = 0;
        if (tuned && now < deadline && !spin_to(_clock, s.deadline_ns, deadline, now, spin_ns)) {
            m._st_reloads.fetch_add(1, std::memory_order_relaxed);
            continue;
        }
        m.send_head(*j, deadline, now, wakeup_latency, spin_ns, lead);
        // The lead's quantile only when no member's next send is close.
        if (tuned) {
            const std::int64_t after = _clock.now_monotonic_ns();
            bool room = true;
            for (dispatcher* o : _members) {
                if (const dispatcher::queued_job* nx = o->pending_head(); nx != nullptr) {
                    room = room && o->_slots[nx->slot].deadline_ns.load(std::memory_order_relaxed) - after >
                                       m._lead.lead_ns() + adapt_guard_ns;
                }
            }
            if (room && m._lead.adapt()) {
                m._lead_ns_pub.store(m._lead.lead_ns(), std::memory_order_relaxed);
            }
        }
    }
    for (dispatcher* m : _members) {
        finish_member(*m);
    }
}

void dispatch_group::finish_member(dispatcher& m) noexcept { m.finish_on_stop(); }

}  // namespace qrt::dispatch
