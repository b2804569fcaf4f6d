// The durability tracker on its own (durability.hpp), without a ledger: a
// real SQLite store in a temp directory, the real commit writer, a stand-in
// for the event loop (a queue of posted callbacks this thread runs) and the
// writer's test seam, which holds a group before its COMMIT or fails it.
// Sequence numbers, the undurable set and when events are published across
// a group commit; counts and states, never timings.

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "fake_loop.hpp"
#include "qrt/timeline/durability.hpp"

namespace qrt::timeline::test {
namespace {

// Holds every group before its COMMIT while closed; fails the next group
// when told to.
class commit_gate {
public:
    std::function<status(std::size_t)> hook() {
        return [this](std::size_t) -> status {
            std::unique_lock<std::mutex> lk(_mu);
            ++_arrived;
            _cv.notify_all();
            _cv.wait(lk, [this] { return _open; });
            if (_fail_next) {
                _fail_next = false;
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
    void fail_next() {
        const std::lock_guard<std::mutex> lk(_mu);
        _fail_next = true;
    }
    bool wait_arrived(std::size_t n) {
        std::unique_lock<std::mutex> lk(_mu);
        return _cv.wait_for(lk, std::chrono::seconds(20), [&] { return _arrived >= n; });
    }

private:
    std::mutex _mu;
    std::condition_variable _cv;
    bool _open = false;
    bool _fail_next = false;
    std::size_t _arrived = 0;
};

reservation row(std::uint64_t id, res_state st = res_state::committed) {
    reservation r;
    r.id = id;
    r.tenant = "t";
    r.qpu = "q0";
    r.start_ns = 1'000'000'000LL * static_cast<std::int64_t>(id);
    r.duration_ns = 1'000'000;
    r.fencing_token = id;
    r.state = st;
    return r;
}

event ev(std::uint64_t id, std::string type) {
    event e;
    e.type = std::move(type);
    e.reservation_id = id;
    return e;
}

class durability_test : public ::testing::Test {
protected:
    void SetUp() override {
        _dir = std::filesystem::temp_directory_path() /
               ("qrt-durability-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(_dir);
        std::filesystem::create_directories(_dir);
        _path = (_dir / "ledger.db").string();
    }
    void TearDown() override {
        _gate.open();
        _d.reset();
        std::filesystem::remove_all(_dir);
    }

    durability& make(std::size_t group_max) {
        durability_hooks h;
        h.publish = [this](std::vector<event>& evs) {
            for (event& e : evs) {
                _published.push_back(e.type + ":" + std::to_string(e.reservation_id));
            }
            evs.clear();
        };
        h.durable = [this](std::uint64_t seq) { _durable_calls.push_back(seq); };
        h.undo = [this](stored_state* disk) {
            ++_undos;
            _disk_rows = disk != nullptr ? static_cast<int>(disk->reservations.size()) : -1;
        };
        h.redo = [this] { ++_redos; };
        _d = std::make_unique<durability>(
            durability_options{group_max, std::chrono::microseconds{0}, _gate.hook(), {}}, std::move(h));
        auto st = store::open(_path);
        EXPECT_TRUE(st.has_value()) << (st ? "" : st.err().message);
        _d->attach(std::move(*st));
        auto loaded = _d->load();
        EXPECT_TRUE(loaded.has_value());
        _d->set_listener([this](const commit_notice& n) { _notices.push_back(n); });
        return *_d;
    }

    // One change putting `ids`, with one "committed" event each.
    status change(durability& d, std::vector<std::uint64_t> ids) {
        change_set c;
        c.seq = d.next_seq();
        std::vector<event> evs;
        std::vector<std::uint64_t> commits;
        for (const std::uint64_t id : ids) {
            c.puts.push_back(row(id));
            evs.push_back(ev(id, "committed"));
            commits.push_back(id);
        }
        c.next_id = 100;
        return d.persist(std::move(c), evs, commits);
    }

    std::filesystem::path _dir;
    std::string _path;
    fake_loop _loop;
    commit_gate _gate;
    std::unique_ptr<durability> _d;
    std::vector<std::string> _published;
    std::vector<std::uint64_t> _durable_calls;
    std::vector<commit_notice> _notices;
    int _undos = 0;
    int _redos = 0;
    int _disk_rows = -2;
};

TEST_F(durability_test, without_a_writer_each_change_is_durable_before_persist_returns) {
    _gate.open();
    durability& d = make(1);
    d.start_writer(_loop.poster());  // group_max 1: no writer
    EXPECT_FALSE(d.has_writer());
    ASSERT_TRUE(change(d, {1}));
    EXPECT_EQ(d.latest_seq(), 1u);
    EXPECT_EQ(d.durable_seq(), 1u);
    EXPECT_EQ(d.change_seq_of(1), 0u);
    EXPECT_TRUE(d.all_durable());
    EXPECT_EQ(_published, (std::vector<std::string>{"committed:1"}));
    // On disk: a second tracker on the same file reads the row back.
    _d.reset();
    auto st = store::open(_path);
    ASSERT_TRUE(st.has_value());
    auto loaded = (*st)->load();
    ASSERT_TRUE(loaded.has_value());
    ASSERT_EQ(loaded->reservations.size(), 1u);
    EXPECT_EQ(loaded->reservations[0].id, 1u);
}

TEST_F(durability_test, sequences_and_the_undurable_set_follow_a_group_commit) {
    durability& d = make(64);
    d.start_writer(_loop.poster());
    ASSERT_TRUE(d.has_writer());
    ASSERT_TRUE(change(d, {1}));        // seq 1: the writer takes it alone and holds it
    ASSERT_TRUE(_gate.wait_arrived(1));
    ASSERT_TRUE(change(d, {2, 3}));     // seq 2 and 3 queue behind it: one group
    ASSERT_TRUE(change(d, {2}));
    EXPECT_EQ(d.latest_seq(), 3u);
    EXPECT_EQ(d.durable_seq(), 0u);
    EXPECT_EQ(d.change_seq_of(1), 1u);
    EXPECT_EQ(d.change_seq_of(2), 3u);  // its last change
    EXPECT_EQ(d.change_seq_of(3), 2u);
    EXPECT_FALSE(d.all_durable());
    // An operation that changed no row: its event follows what is in flight.
    std::vector<event> idle{ev(9, "tick")};
    d.follow(idle);
    EXPECT_TRUE(_published.empty());

    _gate.open();
    ASSERT_TRUE(_loop.run_until([&] { return d.durable_seq() == 3; }));
    EXPECT_TRUE(d.all_durable());
    EXPECT_EQ(d.change_seq_of(2), 0u);
    EXPECT_EQ(_published, (std::vector<std::string>{"committed:1", "committed:2", "committed:3",
                                                    "committed:2", "tick:9"}));
    ASSERT_EQ(_notices.size(), 2u);  // the first group, then the other two
    EXPECT_EQ(_notices[0].durable_seq, 1u);
    EXPECT_EQ(_notices[1].durable_seq, 3u);
    EXPECT_EQ(_notices[1].changes, 2u);
    std::vector<std::uint64_t> committed;
    for (const commit_notice& n : _notices) {
        for (const auto& dj : n.committed) {
            committed.push_back(dj.seq * 100 + dj.id);
        }
    }
    EXPECT_EQ(committed, (std::vector<std::uint64_t>{101, 202, 203, 302}));
    EXPECT_EQ(_durable_calls.back(), 3u);
    EXPECT_EQ(d.commits_failed(), 0u);
    EXPECT_EQ(_undos, 0);
}

TEST_F(durability_test, a_failed_group_resolves_its_range_publishes_nothing_and_reloads) {
    durability& d = make(64);
    d.start_writer(_loop.poster());
    _gate.open();
    ASSERT_TRUE(change(d, {1}));
    ASSERT_TRUE(_loop.run_until([&] { return d.durable_seq() == 1; }));
    _published.clear();
    _gate.fail_next();
    ASSERT_TRUE(change(d, {2}));
    ASSERT_TRUE(_loop.run_until([&] { return !_notices.empty() && _notices.back().failed_to != 0; }));
    const commit_notice& n = _notices.back();
    EXPECT_EQ(n.failed_from, 2u);
    EXPECT_EQ(n.failed_to, 2u);
    EXPECT_NE(n.why.find("the disk said no"), std::string::npos) << n.why;
    EXPECT_EQ(d.durable_seq(), 2u);  // resolved: it did not happen
    EXPECT_EQ(d.latest_seq(), 2u);
    EXPECT_TRUE(d.all_durable());
    EXPECT_TRUE(_published.empty());
    EXPECT_EQ(_undos, 1);
    EXPECT_EQ(_disk_rows, 1);  // what the store holds: the first change only
    EXPECT_EQ(_redos, 1);
    EXPECT_EQ(d.commits_failed(), 1u);
    // The writer goes on after the failure.
    ASSERT_TRUE(change(d, {3}));
    EXPECT_EQ(d.change_seq_of(3), 3u);
    ASSERT_TRUE(_loop.run_until([&] { return d.durable_seq() == 3; }));
    EXPECT_EQ(_published, (std::vector<std::string>{"committed:3"}));
}

}  // namespace
}  // namespace qrt::timeline::test
