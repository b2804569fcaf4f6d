// The durable store: round trip, restart rules, schema migrations, and kill -9
// at random points keeping exactly the acknowledged reservations.
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string_view>
#include <utility>
#include <vector>
#include <thread>

#include "helpers.hpp"

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;
namespace fs = std::filesystem;

class store_test : public ::testing::Test {
protected:
    void SetUp() override {
        std::string tmpl = (fs::temp_directory_path() / "qrt-timeline-XXXXXX").string();
        ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
        _dir = tmpl;
        _db = (fs::path(_dir) / "ledger.db").string();
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(_dir, ec);
    }
    std::unique_ptr<ledger> open_at(std::int64_t now_ns, std::string policy = "edf-backfill") {
        return make_ledger(std::move(policy), {periodic_qpu("q0"), periodic_qpu("q1"), pushed_qpu("p0")},
                           on_calibration_change::replace, _db, now_ns);
    }
    void sql(const std::string& stmt) {
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(_db.c_str(), &db), SQLITE_OK);
        char* err = nullptr;
        const int rc = sqlite3_exec(db, stmt.c_str(), nullptr, nullptr, &err);
        EXPECT_EQ(rc, SQLITE_OK) << (err != nullptr ? err : "");
        sqlite3_free(err);
        sqlite3_close(db);
    }
    std::string _dir;
    std::string _db;
};

TEST_F(store_test, everything_survives_a_restart_unchanged) {
    std::vector<reservation> before;
    std::vector<calibration_window> windows;
    {
        auto l = open_at(t0_ns);
        ASSERT_TRUE(l);
        ASSERT_TRUE(l->update_calibration(
            "p0", {calibration_window{5, t0_ns + 50 * s_ns, t0_ns + 150 * s_ns, 0.97, 500 * s_ns}},
            t0_ns));
        auto a = l->reserve("alice", req(10), "key-a", 0, t0_ns);
        auto with_shots = req(20);
        with_shots.shots = 300;  // the request's shot count is kept with the job
        auto b = l->submit("bob", with_shots, "", {1, 2, 3}, t0_ns);
        auto g = l->reserve_gang("carol", req(5), 3, "g", 0, t0_ns);
        auto c = l->reserve("alice", req(10), "", 0, t0_ns);
        ASSERT_TRUE(a && b && g && c);
        ASSERT_TRUE(l->release("alice", c->id, c->fencing_token, t0_ns));
        ASSERT_TRUE(l->commit("alice", a->id, a->fencing_token, {0, 255}, t0_ns, 7));
        before = snapshot(*l);
        windows = *l->calibration("p0", t0_ns);
    }
    auto l = open_at(t0_ns);
    ASSERT_TRUE(l);
    EXPECT_EQ(snapshot(*l), before);
    for (const auto& r : before) {
        ASSERT_NE(l->find(r.id), nullptr);
        EXPECT_EQ(l->find(r.id)->shots, r.shots) << "reservation " << r.id;
    }
    EXPECT_EQ(std::count_if(before.begin(), before.end(), [](const reservation& r) { return r.shots == 300; }), 1);
    EXPECT_EQ(std::count_if(before.begin(), before.end(), [](const reservation& r) { return r.shots == 7; }), 1);
    EXPECT_EQ(*l->calibration("p0", t0_ns), windows);
    EXPECT_INVARIANTS(*l);
    // Idempotency and the id counter continue across the restart; a new
    // token is none of the stored ones (tokens are drawn, not counted).
    auto again = l->reserve("alice", req(10), "key-a", 0, t0_ns);
    ASSERT_TRUE(again);
    EXPECT_EQ(again->id, before.front().id);
    auto fresh = l->reserve("alice", req(10), "", 0, t0_ns);
    ASSERT_TRUE(fresh);
    EXPECT_GT(fresh->id, before.back().id);
    for (const reservation& r : before) {
        EXPECT_NE(fresh->fencing_token, r.fencing_token);
    }
}

// Fencing tokens come from the token source (getrandom in the daemon): a
// draw of 0, or of a token a record holds (also one read back from the
// store after a restart), is drawn again; a gang's members share one.
TEST_F(store_test, a_drawn_token_is_never_0_nor_one_a_record_holds_also_after_a_restart) {
    std::vector<std::uint64_t> draws;
    std::size_t next = 0;
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    o.token_source = [&] { return next < draws.size() ? draws[next++] : 0; };
    const auto open = [&] {
        auto l = ledger::open({periodic_qpu("q0"), periodic_qpu("q1")}, o, _db, t0_ns);
        EXPECT_TRUE(l.has_value()) << (l ? "" : l.err().message);
        return l ? std::move(*l) : nullptr;
    };
    std::uint64_t a_token = 0;
    {
        auto l = open();
        ASSERT_TRUE(l);
        // 0 is no token; the top bit is dropped (63 bits).
        draws = {0, (1ULL << 63) | 77};
        auto a = l->reserve("alice", req(10), "", 0, t0_ns);
        ASSERT_TRUE(a) << a.err().message;
        EXPECT_EQ(a->fencing_token, 77U);
        a_token = a->fencing_token;
        // 77 is alice's: drawn again.
        draws = {77, 4242};
        next = 0;
        auto g = l->reserve_gang("bob", req(5), 2, "g", 0, t0_ns);
        ASSERT_TRUE(g) << g.err().message;
        EXPECT_EQ((*g)[0].fencing_token, 4242U);
        EXPECT_EQ((*g)[1].fencing_token, 4242U);
    }
    auto l = open();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->find(1)->fencing_token, a_token);
    draws = {77, 4242, 9};
    next = 0;
    auto c = l->reserve("carol", req(10), "", 0, t0_ns);
    ASSERT_TRUE(c) << c.err().message;
    EXPECT_EQ(c->fencing_token, 9U);
    // A source that never gives a free token still ends: the next free
    // value upward.
    draws = {9, 9, 9, 9, 9, 9, 9, 9, 9};
    next = 0;
    auto d = l->reserve("carol", req(10), "", 0, t0_ns);
    ASSERT_TRUE(d) << d.err().message;
    EXPECT_EQ(d->fencing_token, 10U);
}

TEST_F(store_test, on_restart_passed_starts_become_missed_and_nothing_runs_late) {
    std::uint64_t committed = 0;
    std::uint64_t held = 0;
    std::uint64_t dispatched = 0;
    std::uint64_t future = 0;
    {
        auto l = open_at(t0_ns);
        auto c = l->submit("a", req(10), "", {1}, t0_ns);
        auto h = l->reserve("a", req(10), "", 5 * s_ns, t0_ns);
        auto d = l->submit("a", req(10), "", {1}, t0_ns);
        auto f = l->submit("a", req(10, t0_ns + 5 * period_ns), "", {1}, t0_ns);
        ASSERT_TRUE(c && h && d && f);
        ASSERT_TRUE(l->mark_dispatched(d->id, d->start_ns));
        committed = c->id;
        held = h->id;
        dispatched = d->id;
        future = f->id;
    }
    const std::int64_t later = t0_ns + 2 * period_ns;
    auto l = open_at(later);
    ASSERT_TRUE(l);
    const auto m = l->status("a", committed);
    EXPECT_EQ(m->state, res_state::missed);
    EXPECT_EQ(m->reason, "agent was down at start");
    EXPECT_EQ(l->status("a", held)->state, res_state::expired);
    EXPECT_EQ(l->status("a", dispatched)->state, res_state::failed);
    EXPECT_EQ(l->status("a", future)->state, res_state::committed);
    EXPECT_EQ(l->due_jobs("q0", later + 10 * period_ns).size() +
                  l->due_jobs("q1", later + 10 * period_ns).size(),
              1U);
    std::set<std::string> types;
    for (const event& e : l->drain_events()) {
        types.insert(e.type);
    }
    EXPECT_EQ(types, (std::set<std::string>{"missed", "expired", "failed"}));
    EXPECT_INVARIANTS(*l);
    // And the restart decisions are durable too.
    l.reset();
    auto again = open_at(later);
    EXPECT_EQ(again->status("a", committed)->state, res_state::missed);
}

TEST_F(store_test, schema_is_versioned_and_migrated) {
    {
        auto s = store::open(_db);
        ASSERT_TRUE(s);
        EXPECT_EQ((*s)->schema_version(), store::k_schema_version);
    }
    // Pretend the file was written by schema 1 (before the index and the
    // shots column existed).
    sql("DROP INDEX reservations_idempotency; ALTER TABLE reservations DROP COLUMN shots;"
        " UPDATE schema_version SET version = 1;");
    {
        auto s = store::open(_db);
        ASSERT_TRUE(s);
        EXPECT_EQ((*s)->schema_version(), 3);
    }
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(_db.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "SELECT count(*) FROM sqlite_master WHERE name = "
                                 "'reservations_idempotency'",
                                 -1, &st, nullptr),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int(st, 0), 1);
    sqlite3_finalize(st);
    ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr), SQLITE_OK);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
    // A newer schema than this build knows is refused, not guessed at.
    sql("UPDATE schema_version SET version = 99;");
    auto s = store::open(_db);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.err().reason, reason::store_error);
    EXPECT_NE(s.err().message.find("99"), std::string::npos);
}

TEST_F(store_test, an_unusable_path_is_a_store_error_naming_it) {
    ledger_options o;
    auto l = ledger::open({periodic_qpu("q0")}, o, _dir + "/no/such/dir/ledger.db", t0_ns);
    ASSERT_FALSE(l);
    EXPECT_EQ(l.err().reason, reason::store_error);
    EXPECT_NE(l.err().message.find("/no/such/dir"), std::string::npos);
}

TEST_F(store_test, a_reservation_on_a_qpu_no_longer_configured_is_refused_on_open) {
    {
        auto l = open_at(t0_ns);
        request r = req(10);
        r.qpus = {"q1"};
        ASSERT_TRUE(l->reserve("a", r, "", 0, t0_ns));
    }
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    auto l = ledger::open({periodic_qpu("q0")}, o, _db, t0_ns);
    ASSERT_FALSE(l);
    EXPECT_EQ(l.err().reason, reason::unknown_qpu);
}

// The ledger holds every tenant's payloads: no other local user may read the
// database or its WAL, whether the store is new or was created 0644 by an
// older qrtd (another tenant read a victim's payload from it).
TEST_F(store_test, the_database_and_its_wal_are_readable_by_their_owner_only) {
    const auto mode_of = [](const std::string& p) {
        struct stat st {};
        return ::stat(p.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
    };
    const mode_t old_umask = ::umask(022);
    {
        auto l = open_at(t0_ns);
        ASSERT_TRUE(l->reserve("alice", req(10), "k", 0, t0_ns));
        EXPECT_EQ(mode_of(_db), 0600);
        EXPECT_EQ(mode_of(_db + "-wal"), 0600);
        EXPECT_EQ(mode_of(_db + "-shm"), 0600);
    }
    for (const char* f : {"", "-wal", "-shm"}) {
        if (mode_of(_db + f) >= 0) {
            ASSERT_EQ(::chmod((_db + f).c_str(), 0644), 0);
        }
    }
    {
        auto l = open_at(t0_ns);
        ASSERT_TRUE(l->reserve("alice", req(10), "k2", 0, t0_ns));
        EXPECT_EQ(mode_of(_db), 0600);
        EXPECT_EQ(mode_of(_db + "-wal"), 0600);
    }
    ::umask(old_umask);
}

// The WAL does not grow with the number of writes: SQLite checkpoints it
// every 1000 pages and keeps it at most the size limit, and checkpoint()
// (every minute in the daemon) truncates it to nothing.
TEST_F(store_test, the_wal_stays_bounded_under_many_writes_and_a_checkpoint_truncates_it) {
    const auto size_of = [](const std::string& p) {
        std::error_code ec;
        const auto n = fs::file_size(p, ec);
        return ec ? std::uintmax_t{0} : n;
    };
    auto l = open_at(t0_ns);
    std::uintmax_t largest = 0;
    for (int i = 0; i < 1500; ++i) {
        auto r = l->reserve("alice", req(10), "k" + std::to_string(i), 0, t0_ns);
        ASSERT_TRUE(r) << i << ": " << r.err().message;
        ASSERT_TRUE(l->release("alice", r->id, r->fencing_token, t0_ns)) << i;
        largest = std::max(largest, size_of(_db + "-wal"));
    }
    EXPECT_LE(largest, 2U * static_cast<std::uintmax_t>(store::k_wal_size_limit_bytes));
    ASSERT_TRUE(l->checkpoint());
    EXPECT_EQ(size_of(_db + "-wal"), 0U);
    // Nothing acknowledged is lost by the checkpoint.
    l.reset();
    auto again = open_at(t0_ns);
    EXPECT_EQ(again->stats().reservations, 1500U);
}

// A child reserves in a loop and reports each id on a pipe only after
// reserve() returned (= acknowledged).  SIGKILL at a random point; the
// reopened store must hold every acknowledged reservation and nothing else,
// except possibly the one in flight, which was never acknowledged.
TEST_F(store_test, kill_9_at_random_points_keeps_exactly_the_acknowledged_set) {
    std::mt19937 rng(12345);
    std::set<std::uint64_t> acked;
    constexpr int k_rounds = 6;
    for (int round = 0; round < k_rounds; ++round) {
        int fds[2];
        ASSERT_EQ(pipe(fds), 0);
        const pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            ledger_options o;
            o.horizon_ns = 20 * period_ns;
            auto l = ledger::open({periodic_qpu("q0"), periodic_qpu("q1"), pushed_qpu("p0")}, o,
                                  _db, t0_ns);
            if (!l) {
                _exit(3);
            }
            for (int i = 0; i < 1'000'000; ++i) {
                request r;
                r.duration_ns = 1'000'000;  // 1 ms
                auto res = (*l)->reserve("t", r, "r" + std::to_string(round) + "-" + std::to_string(i),
                                         3'600 * s_ns, t0_ns);
                if (!res) {
                    _exit(4);
                }
                const std::uint64_t id = res->id;
                if (write(fds[1], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
                    _exit(5);
                }
            }
            _exit(0);
        }
        close(fds[1]);
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(80, 400)(rng)));
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        int wstatus = 0;
        ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
        ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited early with " << WEXITSTATUS(wstatus);
        std::uint64_t id = 0;
        std::size_t this_round = 0;
        while (read(fds[0], &id, sizeof id) == static_cast<ssize_t>(sizeof id)) {
            acked.insert(id);
            ++this_round;
        }
        close(fds[0]);
        auto l = open_at(t0_ns);
        ASSERT_TRUE(l);
        const std::uint64_t max_acked = acked.empty() ? 0 : *acked.rbegin();
        std::set<std::uint64_t> present;
        for (std::uint64_t i = 1; i <= max_acked + 5; ++i) {
            if (const reservation* r = l->find(i)) {
                present.insert(i);
                EXPECT_EQ(r->state, res_state::held);
            }
        }
        for (const std::uint64_t a : acked) {
            EXPECT_TRUE(present.count(a) == 1) << "acknowledged reservation " << a << " lost";
        }
        std::vector<std::uint64_t> extra;
        for (const std::uint64_t p : present) {
            if (acked.count(p) == 0) {
                extra.push_back(p);
            }
        }
        // The one in flight when the child died: committed but not yet
        // reported.  It must be the newest, and there is at most one.
        ASSERT_LE(extra.size(), 1U) << "round " << round;
        if (!extra.empty()) {
            EXPECT_GT(extra.front(), max_acked);
            acked.insert(extra.front());  // it exists now; later rounds must keep it
        }
        EXPECT_INVARIANTS(*l);
        RecordProperty("round_" + std::to_string(round), static_cast<int>(this_round));
        EXPECT_GT(this_round + acked.size(), 0U);
    }
    EXPECT_GT(acked.size(), 10U) << "the child never got far enough to test anything";
}

}  // namespace
}  // namespace qrt::timeline

namespace qrt::timeline {
namespace {

using namespace qrt::timeline::test;

// While another connection holds the database exclusively, the commit cannot
// happen: the operation must fail with store_error and leave no trace in
// memory either (nothing is acknowledged that is not on disk).
TEST(store_failure, an_operation_whose_commit_fails_is_not_applied) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "qrt-timeline-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    const std::string db_path = tmpl + "/ledger.db";
    ledger_options o;
    o.horizon_ns = 20 * period_ns;
    o.store_busy_timeout_ms = 50;
    auto opened = ledger::open({periodic_qpu("q0"), periodic_qpu("q1")}, o, db_path, t0_ns);
    ASSERT_TRUE(opened);
    auto l = std::move(*opened);
    auto kept = l->reserve("a", req(10), "k1", 0, t0_ns);
    ASSERT_TRUE(kept);
    l->drain_events();
    const auto before = snapshot(*l);
    sqlite3* other = nullptr;
    ASSERT_EQ(sqlite3_open(db_path.c_str(), &other), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
    auto r = l->reserve("a", req(10), "k2", 0, t0_ns);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().reason, reason::store_error);
    auto c = l->commit("a", kept->id, kept->fencing_token, {1}, t0_ns);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.err().reason, reason::store_error);
    EXPECT_EQ(snapshot(*l), before);
    EXPECT_TRUE(l->drain_events().empty());
    EXPECT_INVARIANTS(*l);
    ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(other);
    // Once the database is free again the same operations succeed.
    auto again = l->reserve("a", req(10), "k2", 0, t0_ns);
    ASSERT_TRUE(again);
    EXPECT_GT(again->id, kept->id);
    EXPECT_TRUE(l->commit("a", kept->id, kept->fencing_token, {1}, t0_ns));
    EXPECT_INVARIANTS(*l);
    l.reset();
    std::error_code ec;
    std::filesystem::remove_all(tmpl, ec);
}

// A ledger written before the shot count was kept (schema 2) opens with
// its jobs intact and shots 0 for each: not stated, the hand-over's default.
TEST_F(store_test, a_schema_2_ledger_is_migrated_and_its_jobs_keep_the_shot_count_their_payload_stated) {
    // Before schema 3 the hand-over read "shots" from a JSON payload at
    // dispatch; the migration reads it once, so an acknowledged job is sent
    // with the count it was acknowledged with.
    const auto text = [](std::string_view s) { return blob(s.begin(), s.end()); };
    const std::vector<std::pair<blob, std::uint32_t>> cases = {
        {blob({1, 2, 3}), 0},                      // opaque: the default
        {text(R"({"shots": 300, "x": 1})"), 300},  // what the hand-over read
        {text(R"({"shots": 5000000})"), 1000000},  // capped as it was
        {text(R"({"shots": -3})"), 0},             // not a count
        {text(R"({"shots": 2.5})"), 0},
        {text(R"({"shots": 7)"), 0},               // malformed JSON
        {text(R"([{"shots": 9}])"), 0},            // not an object
    };
    std::vector<std::uint64_t> ids;
    {
        auto l = open_at(t0_ns);
        ASSERT_TRUE(l);
        for (std::size_t i = 0; i < cases.size(); ++i) {
            auto r = req(20);
            r.not_before_ns = t0_ns + static_cast<std::int64_t>(i) * 1'000'000'000;
            r.shots = 300;
            auto b = l->submit("bob", r, "k" + std::to_string(i), cases[i].first, t0_ns);
            ASSERT_TRUE(b) << i;
            ids.push_back(b->id);
        }
    }
    sql("ALTER TABLE reservations DROP COLUMN shots; UPDATE schema_version SET version = 2;");
    auto l = open_at(t0_ns);
    ASSERT_TRUE(l);
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto* r = l->find(ids[i]);
        ASSERT_NE(r, nullptr) << i;
        EXPECT_EQ(r->state, res_state::committed) << i;
        EXPECT_EQ(r->shots, cases[i].second) << i;
        EXPECT_EQ(r->payload, cases[i].first) << i;
    }
}

}  // namespace
}  // namespace qrt::timeline
