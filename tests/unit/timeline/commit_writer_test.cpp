// Group commit: the ledger's writer thread (commit_writer.hpp), driven
// through the ledger with a real SQLite store, a stand-in for the event
// loop (a queue of posted callbacks this thread runs) and the writer's test
// seam, which blocks a group in flight or fails it.  Counts and states,
// never timings.  Threaded: run under ThreadSanitizer too.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "fake_loop.hpp"
#include "helpers.hpp"

namespace qrt::timeline::test {
namespace {

// The writer's seam: holds every group before its COMMIT while closed, and
// fails the next `fail_next` groups.
class commit_gate {
public:
    std::function<status(std::size_t)> hook() {
        return [this](std::size_t changes) -> status {
            std::unique_lock<std::mutex> lk(_mu);
            ++_arrived;
            _groups.push_back(changes);
            _cv.notify_all();
            _cv.wait(lk, [this] { return _open; });
            if (_fail_next > 0) {
                --_fail_next;
                return make_error(reason::store_error, "test: the disk said no");
            }
            return {};
        };
    }
    void open() {
        const std::lock_guard<std::mutex> lk(_mu);
        _open = true;
        _cv.notify_all();
    }
    void close() {
        const std::lock_guard<std::mutex> lk(_mu);
        _open = false;
    }
    void fail_next(int n) {
        const std::lock_guard<std::mutex> lk(_mu);
        _fail_next = n;
    }
    // Wait until a group is held at the gate.
    bool wait_arrived(std::size_t n) {
        std::unique_lock<std::mutex> lk(_mu);
        return _cv.wait_for(lk, std::chrono::seconds(20), [&] { return _arrived >= n; });
    }
    std::vector<std::size_t> groups() {
        const std::lock_guard<std::mutex> lk(_mu);
        return _groups;
    }

private:
    std::mutex _mu;
    std::condition_variable _cv;
    bool _open = false;
    int _fail_next = 0;
    std::size_t _arrived = 0;
    std::vector<std::size_t> _groups;
};

class group_commit : public ::testing::Test {
protected:
    void SetUp() override {
        _dir = std::filesystem::temp_directory_path() /
               ("qrt-group-commit-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(_dir);
        std::filesystem::create_directories(_dir);
        _path = (_dir / "ledger.db").string();
    }
    void TearDown() override {
        _ledger.reset();
        std::filesystem::remove_all(_dir);
    }

    ledger& open(std::size_t queue_max = 4096, std::int64_t min_lead_ns = 0) {
        ledger_options o;
        o.policy = "fifo";
        o.horizon_ns = 20 * period_ns;
        o.commit_group_max = 64;
        o.commit_queue_max = queue_max;
        o.min_lead_ns = min_lead_ns;
        o.commit_hook = _gate.hook();
        o.reload_hook = [this]() -> status {
            if (_fail_reload.load()) {
                return make_error(reason::store_error, "test: the disk cannot be read back");
            }
            return {};
        };
        auto l = ledger::open({periodic_qpu("q0")}, o, _path, t0_ns);
        EXPECT_TRUE(l.has_value()) << (l ? "" : l.err().message);
        _ledger = std::move(*l);
        _ledger->start_writer(_loop.poster());
        EXPECT_TRUE(_ledger->has_writer());
        _ledger->set_commit_listener([this](const commit_notice& n) { _notices.push_back(n); });
        return *_ledger;
    }

    // What a fresh process would load from the database.
    std::size_t reservations_on_disk() {
        auto l = ledger::open({periodic_qpu("q0")}, ledger_options{}, _path, t0_ns);
        EXPECT_TRUE(l.has_value());
        return l ? (*l)->stats().reservations : 0;
    }

    reservation reserve(ledger& l, int key) {
        auto r = l.reserve("tenant", req(1), "k" + std::to_string(key), 0, t0_ns);
        EXPECT_TRUE(r.has_value()) << (r ? "" : r.err().message);
        return r ? *r : reservation{};
    }

    std::filesystem::path _dir;
    std::string _path;
    fake_loop _loop;
    commit_gate _gate;
    std::atomic<bool> _fail_reload{false};  // the writer's reload after a failed group fails
    std::vector<commit_notice> _notices;
    std::unique_ptr<ledger> _ledger;
};

TEST_F(group_commit, a_change_is_durable_only_once_its_group_committed) {
    ledger& l = open();
    const reservation r = reserve(l, 1);
    EXPECT_EQ(l.latest_seq(), l.durable_seq() + 1);
    EXPECT_EQ(l.change_seq_of(r.id), l.latest_seq());
    ASSERT_TRUE(_gate.wait_arrived(1));
    // In flight: nothing on disk, and no event published yet.
    EXPECT_EQ(reservations_on_disk(), 0U);
    EXPECT_TRUE(l.drain_events().empty());
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    EXPECT_EQ(l.change_seq_of(r.id), 0U);
    EXPECT_EQ(reservations_on_disk(), 1U);
    EXPECT_EQ(l.drain_events().size(), 1U);  // "reserved", now that it is durable
    ASSERT_EQ(_notices.size(), 1U);
    EXPECT_EQ(_notices[0].failed_to, 0U);
}

TEST_F(group_commit, reads_are_answered_while_a_group_is_in_flight) {
    ledger& l = open();
    const reservation r = reserve(l, 1);
    ASSERT_TRUE(_gate.wait_arrived(1));  // the writer is stuck before COMMIT
    // Reads see the change at once, from memory, without waiting.
    auto st = l.status("tenant", r.id);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->state, res_state::held);
    request q = req(1);
    q.max_candidates = 4;
    auto found = l.query(q, t0_ns);
    ASSERT_TRUE(found.has_value());
    EXPECT_FALSE(found->candidates.empty());
    EXPECT_LT(l.durable_seq(), l.latest_seq());  // still in flight
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
}

TEST_F(group_commit, changes_queued_behind_a_commit_share_the_next_transaction) {
    ledger& l = open();
    reserve(l, 0);
    ASSERT_TRUE(_gate.wait_arrived(1));
    for (int i = 1; i <= 50; ++i) {
        reserve(l, i);
    }
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    // One group of 1 (held at the gate), then the 50 queued behind it in one.
    EXPECT_EQ(_gate.groups(), (std::vector<std::size_t>{1, 50}));
    ASSERT_EQ(_notices.size(), 2U);
    EXPECT_LT(_notices[0].durable_seq, _notices[1].durable_seq);  // in commit order
    EXPECT_EQ(reservations_on_disk(), 51U);
}

TEST_F(group_commit, a_failed_group_undoes_its_changes_and_every_change_queued_after_it) {
    ledger& l = open();
    const reservation kept = reserve(l, 1);
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    _gate.close();
    _gate.fail_next(1);
    const reservation lost = reserve(l, 2);
    ASSERT_TRUE(_gate.wait_arrived(2));
    const reservation lost_too = reserve(l, 3);  // queued on top of the failing one
    auto hb = l.heartbeat("tenant", kept.id, kept.fencing_token, t0_ns + s_ns);
    ASSERT_TRUE(hb.has_value());
    const std::uint64_t last = l.latest_seq();
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() >= last; }));
    ASSERT_EQ(_notices.size(), 2U);
    EXPECT_EQ(_notices[1].failed_from, _notices[0].durable_seq + 1);
    EXPECT_EQ(_notices[1].failed_to, last);
    EXPECT_NE(_notices[1].why.find("the disk said no"), std::string::npos);
    // No phantom: memory equals the disk again.
    EXPECT_EQ(l.find(lost.id), nullptr);
    EXPECT_EQ(l.find(lost_too.id), nullptr);
    ASSERT_NE(l.find(kept.id), nullptr);
    EXPECT_EQ(l.find(kept.id)->lease_expires_ns, kept.lease_expires_ns);  // heartbeat undone
    EXPECT_FALSE(l.has_idempotency_key("tenant", "k2"));
    EXPECT_EQ(l.stats().reservations, 1U);
    EXPECT_INVARIANTS(l);
    EXPECT_EQ(reservations_on_disk(), 1U);
    // And the writer goes on.
    reserve(l, 4);
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    EXPECT_EQ(reservations_on_disk(), 2U);
}

// A failed group whose reload fails too: memory still holds the refused
// changes and nothing tells them from what is on disk.  Fail-stop: none of
// them is ever due, every later change is refused, the notice says the
// ledger stopped, and a fresh open holds exactly what was acknowledged.
TEST_F(group_commit, a_failed_group_whose_reload_fails_stops_the_ledger_and_plans_nothing_refused) {
    ledger& l = open();
    _gate.open();
    auto kept = l.submit("tenant", req(1), "kept", blob{1}, t0_ns);
    ASSERT_TRUE(kept.has_value());
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    _gate.close();
    _gate.fail_next(1);
    _fail_reload = true;
    const std::size_t groups = _gate.groups().size();
    auto refused = l.submit("tenant", req(1, t0_ns + 10 * s_ns), "refused", blob{2}, t0_ns);
    ASSERT_TRUE(refused.has_value());
    ASSERT_TRUE(_gate.wait_arrived(groups + 1));  // the failing group is at the gate
    auto queued = l.submit("tenant", req(1, t0_ns + 20 * s_ns), "queued", blob{3}, t0_ns);
    ASSERT_TRUE(queued.has_value());
    const std::uint64_t last = l.latest_seq();
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() >= last; }));
    ASSERT_FALSE(_notices.empty());
    const commit_notice& n = _notices.back();
    EXPECT_EQ(n.failed_to, last) << "every change from the failed group on did not happen";
    EXPECT_TRUE(n.stopped) << n.why;
    EXPECT_NE(n.why.find("the disk cannot be read back"), std::string::npos) << n.why;
    EXPECT_FALSE(l.stopped().empty());
    // The clients of the refused changes got store_error: none of them may
    // be dispatched, although memory still holds them.
    const auto due = l.due_jobs("q0", t0_ns + period_ns);
    std::set<std::uint64_t> due_ids;
    for (const reservation& r : due) {
        due_ids.insert(r.id);
    }
    EXPECT_EQ(due_ids.count(refused->id), 0U) << "a job answered store_error is due";
    EXPECT_EQ(due_ids.count(queued->id), 0U) << "a job answered store_error is due";
    EXPECT_EQ(due_ids.count(kept->id), 1U) << "the acknowledged job is no longer due";
    // Every later change is refused, and none reaches the disk.
    EXPECT_FALSE(l.accepting_changes());
    auto after = l.submit("tenant", req(1, t0_ns + 30 * s_ns), "after", blob{4}, t0_ns);
    EXPECT_FALSE(after.has_value());
    if (after) {
        EXPECT_EQ(l.due_jobs("q0", t0_ns + period_ns).size(), due.size()) << "a change after the stop is due";
    } else {
        EXPECT_EQ(after.err().reason, reason::store_error) << after.err().message;
    }
    _ledger.reset();
    auto disk = ledger::open({periodic_qpu("q0")}, ledger_options{}, _path, t0_ns);
    ASSERT_TRUE(disk.has_value());
    EXPECT_NE((*disk)->find(kept->id), nullptr);
    EXPECT_EQ((*disk)->find(refused->id), nullptr);
    EXPECT_EQ((*disk)->find(queued->id), nullptr);
    EXPECT_EQ((*disk)->stats().reservations, 1U);
}

TEST_F(group_commit, a_committed_job_is_not_due_until_its_commit_is_durable) {
    ledger& l = open();
    auto job = l.submit("tenant", req(1), "job", blob{1, 2, 3}, t0_ns);
    ASSERT_TRUE(job.has_value());
    ASSERT_TRUE(_gate.wait_arrived(1));
    EXPECT_TRUE(l.due_jobs("q0", job->start_ns + s_ns).empty());
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    const auto due = l.due_jobs("q0", job->start_ns + s_ns);
    ASSERT_EQ(due.size(), 1U);
    EXPECT_EQ(due[0].id, job->id);
}

TEST_F(group_commit, past_the_queue_bound_client_changes_are_refused_until_it_drains) {
    ledger& l = open(8);
    for (int i = 0; i < 8; ++i) {
        reserve(l, i);
    }
    ASSERT_TRUE(_gate.wait_arrived(1));
    EXPECT_GE(l.commit_backlog(), 8U);
    EXPECT_FALSE(l.accepting_changes());
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    EXPECT_EQ(l.commit_backlog(), 0U);
    EXPECT_TRUE(l.accepting_changes());
}

TEST_F(group_commit, closing_the_ledger_commits_what_is_queued) {
    ledger& l = open();
    for (int i = 0; i < 10; ++i) {
        reserve(l, i);
    }
    _gate.open();
    _ledger.reset();  // no loop runs the outcomes: the writer still commits
    EXPECT_EQ(reservations_on_disk(), 10U);
}

// Inside the first window of t0's cycle, well clear of its ends.
constexpr std::int64_t mid_window_ns = t0_ns + 50 * s_ns;
constexpr std::int64_t ms_ns = 1'000'000;

request short_req(std::int64_t duration_ns) {
    request r;
    r.duration_ns = duration_ns;
    r.qpus = {"q0"};
    return r;
}

// The earliest start offered counts the commit backlog, as
// observed: a change made now waits for the groups ahead of it.
TEST_F(group_commit, the_earliest_start_offered_includes_the_observed_commit_backlog) {
    ledger& l = open(4096, 10 * ms_ns);
    reserve(l, 0);
    ASSERT_TRUE(_gate.wait_arrived(1));
    // This group's commit takes at least 200 ms (a slow disk).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    _gate.close();
    reserve(l, 1);  // a group in flight again
    ASSERT_TRUE(_gate.wait_arrived(2));
    EXPECT_GE(l.commit_lead_ns(), 200 * ms_ns);
    request q = short_req(1 * ms_ns);
    auto found = l.query(q, mid_window_ns);
    ASSERT_TRUE(found.has_value());
    ASSERT_FALSE(found->candidates.empty());
    EXPECT_GE(found->candidates.front().start_ns, mid_window_ns + 10 * ms_ns + 200 * ms_ns);
    auto job = l.submit("tenant", q, "job", blob{1}, mid_window_ns);
    ASSERT_TRUE(job.has_value());
    EXPECT_GE(job->start_ns, mid_window_ns + 10 * ms_ns + 200 * ms_ns);
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
}

// Acknowledged means dispatchable: a job whose commit became durable when its start was already
// inside the hand-over lead is taken back before its acknowledgement, and
// the next possible start is named; one still on time is kept.
TEST_F(group_commit, a_job_durable_too_late_for_its_start_is_withdrawn_not_acknowledged) {
    ledger& l = open(4096, 10 * ms_ns);
    _gate.open();
    const auto at = [](std::int64_t ms) {
        request r = short_req(1 * ms_ns);
        r.not_before_ns = mid_window_ns + ms * ms_ns;
        return r;
    };
    auto late = l.submit("tenant", at(100), "late", blob{1, 2}, mid_window_ns);
    auto held = l.reserve("tenant", at(101), "held", 0, mid_window_ns);
    ASSERT_TRUE(late && held);
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    _gate.close();
    auto committed = l.commit("tenant", held->id, held->fencing_token, blob{4}, mid_window_ns);
    ASSERT_TRUE(committed.has_value()) << committed.err().message;
    auto late2 = l.submit("tenant", at(102), "late2", blob{5}, mid_window_ns);
    auto on_time = l.submit("tenant", at(1000), "on-time", blob{3}, mid_window_ns);
    ASSERT_TRUE(late2 && on_time);
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    commit_notice all;
    for (const commit_notice& n : _notices) {
        all.committed.insert(all.committed.end(), n.committed.begin(), n.committed.end());
    }
    ASSERT_EQ(all.committed.size(), 4U);  // late, the held one's commit, late2, on_time
    // The acknowledgements go out at +100 ms: the first three starts are
    // within the 10 ms the hand-over needs, on_time's is not.
    const std::int64_t now = mid_window_ns + 100 * ms_ns;
    ASSERT_GE(on_time->start_ns, now + 10 * ms_ns);
    ASSERT_LT(late2->start_ns, now + 10 * ms_ns);
    const auto withdrawn = l.withdraw_late(all, now, 10 * ms_ns);
    std::set<std::uint64_t> ids;
    for (const late_job& j : withdrawn) {
        ids.insert(j.id);
        EXPECT_GT(j.next_start_ns, now) << j.message;
        EXPECT_NE(j.message.find("retry"), std::string::npos) << j.message;
    }
    EXPECT_EQ(ids, (std::set<std::uint64_t>{late->id, held->id, late2->id}));
    // A one-shot submit is forgotten, its key free again; a held
    // reservation's commit leaves it held, without payload.
    EXPECT_EQ(l.find(late->id), nullptr);
    EXPECT_EQ(l.find(late2->id), nullptr);
    EXPECT_FALSE(l.has_idempotency_key("tenant", "late2"));
    ASSERT_NE(l.find(held->id), nullptr);
    EXPECT_EQ(l.find(held->id)->state, res_state::held);
    EXPECT_TRUE(l.find(held->id)->payload.empty());
    ASSERT_NE(l.find(on_time->id), nullptr);
    EXPECT_EQ(l.find(on_time->id)->state, res_state::committed);
    for (const event& e : l.drain_events()) {
        EXPECT_FALSE(e.type == event_type::committed && ids.count(e.reservation_id) != 0)
            << "a withdrawn job's committed event was published: " << e.reservation_id;
    }
    EXPECT_INVARIANTS(l);
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    auto disk = ledger::open({periodic_qpu("q0")}, ledger_options{}, _path, mid_window_ns);
    ASSERT_TRUE(disk.has_value());
    EXPECT_EQ((*disk)->find(late2->id), nullptr);
    ASSERT_NE((*disk)->find(held->id), nullptr);
    EXPECT_EQ((*disk)->find(held->id)->state, res_state::held);
}

// A failed group undoes the dispatcher's transitions with the
// rest of its range; they record what happened on the wire, so they are
// applied again after the reload.
TEST_F(group_commit, a_failed_group_keeps_the_dispatchers_own_transitions) {
    ledger& l = open();
    _gate.open();
    auto done = l.submit("tenant", req(1), "done", blob{1}, t0_ns);
    auto sent = l.submit("tenant", req(1), "sent", blob{2}, t0_ns);
    ASSERT_TRUE(done && sent);
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    _gate.close();
    _gate.fail_next(1);
    const std::size_t groups = _gate.groups().size();
    ASSERT_TRUE(l.mark_dispatched(done->id, done->start_ns - 1));
    ASSERT_TRUE(_gate.wait_arrived(groups + 1));  // the failing group is at the gate
    ASSERT_TRUE(l.complete(done->id, blob{7, 7}, done->start_ns + s_ns));
    ASSERT_TRUE(l.mark_dispatched(sent->id, sent->start_ns - 2));
    ASSERT_TRUE(l.mark_sent(sent->id, "file", sent->start_ns));
    const std::uint64_t last = l.latest_seq();
    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() >= last; }));
    EXPECT_TRUE(std::any_of(_notices.begin(), _notices.end(),
                            [](const commit_notice& n) { return n.failed_to != 0; }))
        << "the group did not fail";
    ASSERT_TRUE(_loop.run_until([&] { return l.durable_seq() == l.latest_seq(); }));
    const auto check = [&](const ledger& x) {
        const reservation* d = x.find(done->id);
        ASSERT_NE(d, nullptr);
        EXPECT_EQ(d->state, res_state::completed);
        EXPECT_EQ(d->sent_ns, done->start_ns - 1);
        EXPECT_EQ(d->result, (blob{7, 7}));
        const reservation* s = x.find(sent->id);
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->state, res_state::sent);
        EXPECT_EQ(s->sent_ns, sent->start_ns - 2);
    };
    check(l);
    EXPECT_EQ(l.usage_of("tenant"), tenant_usage{});  // nothing counts against quotas
    EXPECT_TRUE(l.due_jobs("q0", t0_ns + period_ns).empty());  // nothing due again
    EXPECT_INVARIANTS(l);
    auto disk = ledger::open({periodic_qpu("q0")}, ledger_options{}, _path, t0_ns);
    ASSERT_TRUE(disk.has_value());
    check(**disk);
}

// A job handed to the dispatch thread (within the durable
// dispatch mark) whose mark_dispatched never reached the disk before a
// crash is unknown on restart, not missed; one beyond the mark is missed;
// after a clean close nothing is unknown.
TEST_F(group_commit, a_job_handed_over_before_a_crash_is_dispatch_unknown_on_restart) {
    std::uint64_t handed = 0;
    std::uint64_t beyond = 0;
    std::int64_t last_start = 0;
    {
        ledger& l = open();
        _gate.open();
        auto a = l.submit("tenant", req(1), "a", blob{1}, t0_ns);
        auto b = l.submit("tenant", req(1, t0_ns + 30 * s_ns), "b", blob{2}, t0_ns);
        ASSERT_TRUE(a && b);
        handed = a->id;
        beyond = b->id;
        last_start = b->start_ns;
        l.extend_dispatch_mark(a->start_ns);
        ASSERT_TRUE(_loop.run_until([&] { return l.dispatch_mark_ns() >= a->start_ns; }));
        ASSERT_LT(l.dispatch_mark_ns(), b->start_ns);
        // The frame of `a` goes out; the crash comes before mark_dispatched.
        _ledger.reset();
    }
    {
        auto l = ledger::open({periodic_qpu("q0")}, ledger_options{}, _path, last_start + s_ns);
        ASSERT_TRUE(l.has_value());
        const reservation* a = (*l)->find(handed);
        ASSERT_NE(a, nullptr);
        EXPECT_EQ(a->state, res_state::failed);
        EXPECT_EQ(a->reason.rfind("dispatch_unknown", 0), 0U) << a->reason;
        const reservation* b = (*l)->find(beyond);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(b->state, res_state::missed);
        EXPECT_EQ(b->reason, "agent was down at start");
        // Submitted now, handed over, then a clean stop: nothing unknown.
        auto c = (*l)->submit("tenant", req(1, last_start + 10 * s_ns), "c", blob{3}, last_start + s_ns);
        ASSERT_TRUE(c.has_value());
        (*l)->extend_dispatch_mark(c->start_ns);
        EXPECT_GE((*l)->dispatch_mark_ns(), c->start_ns);
        (*l)->close();
        handed = c->id;
        last_start = c->start_ns;
    }
    auto l = ledger::open({periodic_qpu("q0")}, ledger_options{}, _path, last_start + s_ns);
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ((*l)->find(handed)->state, res_state::missed);
    EXPECT_EQ((*l)->dispatch_mark_ns(), 0);
}

}  // namespace
}  // namespace qrt::timeline::test
