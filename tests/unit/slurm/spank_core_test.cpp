// spank_qrt's core (tools/slurm/qrt_slurm.c): what a user types after
// --qpu-*, what the plugin then asks qrtd for, and what a user reads when
// it fails.  Each case says what it expected and what came back.

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "qrt_slurm.h"

namespace {

constexpr std::int64_t s = 1'000'000'000;
constexpr std::int64_t now = 1'800'000'000 * s;  // 2027-01-15

std::string msg_of(int rc, const char* msg) { return rc < 0 ? std::string(msg) : "(ok)"; }

TEST(spank_core, durations_take_a_unit_and_refuse_anything_loose) {
    std::int64_t ns = 0;
    char msg[QRT_SLURM_MSG];
    const std::pair<const char*, std::int64_t> good[] = {
        {"2ms", 2'000'000}, {"500us", 500'000}, {"1s", s}, {"3m", 180 * s},
        {"1h", 3600 * s},   {"750", 750},       {"40ns", 40},
    };
    for (const auto& [text, want] : good) {
        ASSERT_EQ(qrt_slurm_parse_duration(text, &ns, msg, sizeof msg), 0) << text << ": " << msg;
        EXPECT_EQ(ns, want) << text;
    }
    for (const char* bad : {"", "0ms", "-1ms", "2 ms", "2MS", "1.5ms", "ms", "2ms ", "9999999h",
                            "18446744073709551617"}) {
        EXPECT_EQ(qrt_slurm_parse_duration(bad, &ns, msg, sizeof msg), -EINVAL) << "'" << bad << "'";
    }
    qrt_slurm_parse_duration("2xs", &ns, msg, sizeof msg);
    EXPECT_NE(std::string(msg).find("'2xs' is not a duration"), std::string::npos) << msg;
}

TEST(spank_core, times_are_relative_with_plus_or_unix_seconds_with_at) {
    int rel = -1;
    std::int64_t t = 0;
    char msg[QRT_SLURM_MSG];
    ASSERT_EQ(qrt_slurm_parse_time("+30s", &rel, &t, msg, sizeof msg), 0) << msg;
    EXPECT_EQ(rel, 1);
    EXPECT_EQ(t, 30 * s);
    ASSERT_EQ(qrt_slurm_parse_time("@1767225600.5", &rel, &t, msg, sizeof msg), 0) << msg;
    EXPECT_EQ(rel, 0);
    EXPECT_EQ(t, 1'767'225'600 * s + 500'000'000);
    ASSERT_EQ(qrt_slurm_parse_time("@1767225600", &rel, &t, msg, sizeof msg), 0);
    EXPECT_EQ(t, 1'767'225'600 * s);
    for (const char* bad : {"30s", "+", "+0s", "@", "@-5", "@12.", "@1.1234567891", "tomorrow"}) {
        EXPECT_LT(qrt_slurm_parse_time(bad, &rel, &t, msg, sizeof msg), 0) << bad;
    }
}

TEST(spank_core, each_option_parses_and_a_bad_value_names_the_option) {
    qrt_slurm_options o;
    qrt_slurm_options_default(&o);
    char msg[QRT_SLURM_MSG];
    EXPECT_EQ(o.count, 1);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-duration", "2ms", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-count", "2", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-priority", "-7", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-min-fidelity", "0.95", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-deadline", "+10s", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-not-before", "@1800000001", msg, sizeof msg), 0);
    EXPECT_EQ(o.duration_ns, 2'000'000);
    EXPECT_EQ(o.count, 2);
    EXPECT_EQ(o.priority, -7);
    EXPECT_DOUBLE_EQ(o.min_fidelity, 0.95);
    EXPECT_TRUE(o.deadline_set && o.deadline_relative);
    EXPECT_TRUE(o.not_before_set && !o.not_before_relative);

    const std::pair<const char*, const char*> bad[] = {
        {"qpu-count", "0"},          {"qpu-count", "65"},         {"qpu-count", "two"},
        {"qpu-min-fidelity", "0"},   {"qpu-min-fidelity", "1.5"}, {"qpu-min-fidelity", "x"},
        {"qpu-priority", "2147483648"}, {"qpu-priority", "1e3"},  {"qpu-duration", "soon"},
        {"qpu-deadline", "10s"},
    };
    for (const auto& [name, value] : bad) {
        const int rc = qrt_slurm_option(&o, name, value, msg, sizeof msg);
        EXPECT_EQ(rc, -EINVAL) << name << "=" << value;
        EXPECT_NE(std::string(msg).find(std::string("--") + name), std::string::npos) << msg;
    }
    EXPECT_EQ(qrt_slurm_option(&o, "qpu-priority", "-2147483648", msg, sizeof msg), 0);
    EXPECT_EQ(o.priority, INT32_MIN);
}

qrt_slurm_config config() {
    qrt_slurm_config c;
    qrt_slurm_config_default(&c);
    return c;
}

TEST(spank_core, the_request_starts_after_the_setup_margin_and_ends_by_the_jobs_time_limit) {
    qrt_slurm_options o;
    qrt_slurm_options_default(&o);
    o.duration_ns = 2'000'000;
    const auto cfg = config();
    qrt_slurm_request r;
    char msg[QRT_SLURM_MSG];
    // A job with 10 minutes left: lease and deadline are its end.
    ASSERT_EQ(qrt_slurm_build_request(&o, &cfg, now, now + 600 * s, &r, msg, sizeof msg), 0) << msg;
    EXPECT_EQ(r.not_before_ns, now + 2 * s);
    EXPECT_EQ(r.deadline_ns, now + 600 * s);
    EXPECT_EQ(r.lease_ns, 600 * s);
    EXPECT_TRUE(r.deadline_from_job);
    // An unlimited job (or one whose end is unknown): max_lease bounds both.
    ASSERT_EQ(qrt_slurm_build_request(&o, &cfg, now, 0, &r, msg, sizeof msg), 0);
    EXPECT_EQ(r.lease_ns, 3600 * s);
    EXPECT_EQ(r.deadline_ns, now + 3600 * s);
    // The user's deadline wins when earlier.
    o.deadline_set = 1;
    o.deadline_relative = 1;
    o.deadline_ns = 30 * s;
    ASSERT_EQ(qrt_slurm_build_request(&o, &cfg, now, now + 600 * s, &r, msg, sizeof msg), 0);
    EXPECT_EQ(r.deadline_ns, now + 30 * s);
    EXPECT_FALSE(r.deadline_from_job);
    EXPECT_EQ(r.lease_ns, 600 * s);
}

TEST(spank_core, a_request_the_time_limit_cannot_hold_fails_before_asking_qrtd) {
    qrt_slurm_options o;
    qrt_slurm_options_default(&o);
    o.duration_ns = 10 * s;
    const auto cfg = config();
    qrt_slurm_request r;
    char msg[QRT_SLURM_MSG];
    int rc = qrt_slurm_build_request(&o, &cfg, now, now + 5 * s, &r, msg, sizeof msg);
    EXPECT_EQ(rc, -ERANGE) << msg_of(rc, msg);
    EXPECT_NE(std::string(msg).find("the job's time limit"), std::string::npos) << msg;
    o.duration_ns = s;
    o.deadline_set = 1;
    o.deadline_relative = 0;
    o.deadline_ns = now - s;
    rc = qrt_slurm_build_request(&o, &cfg, now, 0, &r, msg, sizeof msg);
    EXPECT_EQ(rc, -ERANGE);
    EXPECT_NE(std::string(msg).find("already past"), std::string::npos) << msg;
    rc = qrt_slurm_build_request(&o, &cfg, now, now + s / 2, &r, msg, sizeof msg);
    EXPECT_EQ(rc, -ERANGE);
    EXPECT_NE(std::string(msg).find("less than 1 s"), std::string::npos) << msg;
}

TEST(spank_core, equal_options_give_equal_request_texts_and_any_change_differs) {
    qrt_slurm_options a;
    qrt_slurm_options_default(&a);
    a.duration_ns = 2'000'000;
    qrt_slurm_options b = a;
    char ta[256];
    char tb[256];
    ASSERT_EQ(qrt_slurm_request_text(&a, ta, sizeof ta), 0);
    ASSERT_EQ(qrt_slurm_request_text(&b, tb, sizeof tb), 0);
    EXPECT_STREQ(ta, tb);
    b.count = 2;
    qrt_slurm_request_text(&b, tb, sizeof tb);
    EXPECT_STRNE(ta, tb);
    b = a;
    b.not_before_set = 1;
    b.not_before_relative = 1;
    b.not_before_ns = s;
    qrt_slurm_request_text(&b, tb, sizeof tb);
    EXPECT_STRNE(ta, tb);
}

TEST(spank_core, keys_name_cluster_job_and_step_and_match_their_own_job_only) {
    char k[160];
    ASSERT_EQ(qrt_slurm_key("lab", 42, 0, k, sizeof k), 0);
    EXPECT_STREQ(k, "slurm:lab:42.0");
    ASSERT_EQ(qrt_slurm_key("lab", 42, QRT_SLURM_STEP_BATCH, k, sizeof k), 0);
    EXPECT_STREQ(k, "slurm:lab:42.batch");
    ASSERT_EQ(qrt_slurm_key("", 7, QRT_SLURM_STEP_INTERACTIVE, k, sizeof k), 0);
    EXPECT_STREQ(k, "slurm:-:7.interactive");
    EXPECT_TRUE(qrt_slurm_key_is_job("slurm:lab:42.batch", "lab", 42));
    EXPECT_FALSE(qrt_slurm_key_is_job("slurm:lab:421.batch", "lab", 42));
    EXPECT_FALSE(qrt_slurm_key_is_job("slurm:other:42.batch", "lab", 42));
    char tiny[8];
    EXPECT_EQ(qrt_slurm_key("lab", 42, 0, tiny, sizeof tiny), -ENOSPC);
}

TEST(spank_core, cpu_lists_parse_strictly_and_overlap_names_the_shared_cpus) {
    qrt_slurm_cpus a;
    qrt_slurm_cpus b;
    char buf[64];
    ASSERT_EQ(qrt_slurm_cpus_parse("0-3,8,10-11\n", &a), 0);
    ASSERT_EQ(qrt_slurm_cpus_text(&a, buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "0-3,8,10-11");
    ASSERT_EQ(qrt_slurm_cpus_parse("3,9-10", &b), 0);
    EXPECT_EQ(qrt_slurm_cpus_overlap(&a, &b, buf, sizeof buf), 2);
    EXPECT_STREQ(buf, "3,10");
    ASSERT_EQ(qrt_slurm_cpus_parse("", &b), 0);
    EXPECT_EQ(qrt_slurm_cpus_overlap(&a, &b, buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "");
    for (const char* bad : {"3-1", "a", "1,,2", "1-", "-1", "5000"}) {
        EXPECT_LT(qrt_slurm_cpus_parse(bad, &a), 0) << bad;
    }
}

TEST(spank_core, a_state_file_round_trips_and_a_damaged_one_is_refused) {
    qrt_slurm_held h{};
    h.n = 2;
    h.member[0].id = 11;
    std::strcpy(h.member[0].qpu, "qpu0");
    h.member[1].id = 12;
    std::strcpy(h.member[1].qpu, "qpu1");
    h.fencing_token = 5;
    h.start_ns = now + 2 * s;
    h.end_ns = now + 2 * s + 2'000'000;
    h.lease_expires_ns = now + 600 * s;
    std::strcpy(h.key, "slurm:lab:42.batch");
    char text[2048];
    ASSERT_EQ(qrt_slurm_state_format(&h, text, sizeof text), 0);
    qrt_slurm_held back;
    ASSERT_EQ(qrt_slurm_state_parse(text, &back), 0) << text;
    EXPECT_EQ(back.n, 2);
    EXPECT_EQ(back.member[1].id, 12U);
    EXPECT_STREQ(back.member[1].qpu, "qpu1");
    EXPECT_EQ(back.fencing_token, 5U);
    EXPECT_EQ(back.start_ns, h.start_ns);
    EXPECT_STREQ(back.key, h.key);
    char ids[64];
    ASSERT_EQ(qrt_slurm_ids_text(&back, ids, sizeof ids), 0);
    EXPECT_STREQ(ids, "11,12");
    for (const char* bad : {"", "key=k\nids=1\n", "key=k\nids=x\nfencing_token=1\n",
                            "key=k\nids=1\nfencing_token=1\nsurprise=1\n",
                            "key=k\nids=0\nfencing_token=1\n"}) {
        EXPECT_EQ(qrt_slurm_state_parse(bad, &back), -EINVAL) << bad;
    }
    // A field given twice (a line someone injected) is refused, not won by
    // the last one.
    EXPECT_EQ(qrt_slurm_state_parse("key=k\nids=1\nfencing_token=1\nids=2\n", &back), -EINVAL);
    char name[32];
    ASSERT_EQ(qrt_slurm_state_name(42, QRT_SLURM_STEP_BATCH, name, sizeof name), 0);
    EXPECT_STREQ(name, "42.batch");
}

// Root writes the state file from the step's key and qrtd's answer: a
// field that would break a line (the cluster name in the key, a QPU name)
// is refused, so no field can add a line of its own.
TEST(spank_core, a_state_file_field_with_a_newline_is_refused_and_injects_no_line) {
    qrt_slurm_held h{};
    h.n = 1;
    h.member[0].id = 11;
    std::strcpy(h.member[0].qpu, "qpu0");
    h.fencing_token = 5;
    std::strcpy(h.key, "slurm:lab\nids=7\nfencing_token=9\n#:42.0");
    char text[2048] = "";
    EXPECT_EQ(qrt_slurm_state_format(&h, text, sizeof text), -EINVAL) << text;
    std::strcpy(h.key, "slurm:lab:42.0");
    std::strcpy(h.member[0].qpu, "q\nids=7");
    EXPECT_EQ(qrt_slurm_state_format(&h, text, sizeof text), -EINVAL) << text;
    // The cluster name: neither plugstack.conf nor slurm.conf may carry one.
    auto c = config();
    char msg[QRT_SLURM_MSG];
    EXPECT_EQ(qrt_slurm_config_arg(&c, "cluster=lab\nids=7", msg, sizeof msg), -EINVAL);
    char key[160];
    EXPECT_EQ(qrt_slurm_key("lab\nids=7", 42, 0, key, sizeof key), -EINVAL) << key;
    ASSERT_EQ(qrt_slurm_key("lab", 42, 0, key, sizeof key), 0);
    EXPECT_STREQ(key, "slurm:lab:42.0");
}

TEST(spank_core, plugstack_arguments_are_checked_and_an_unknown_one_is_named) {
    auto c = config();
    char msg[QRT_SLURM_MSG];
    ASSERT_EQ(qrt_slurm_config_arg(&c, "socket=/run/x/qrtd.sock", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_config_arg(&c, "setup_margin=500ms", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_config_arg(&c, "cpuset_check=no", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_config_arg(&c, "timeout=2s", msg, sizeof msg), 0);
    EXPECT_STREQ(c.socket, "/run/x/qrtd.sock");
    EXPECT_EQ(c.setup_margin_ns, 500'000'000);
    EXPECT_EQ(c.cpuset_check, 0);
    EXPECT_EQ(c.timeout_ms, 2000);
    EXPECT_EQ(qrt_slurm_config_arg(&c, "sockett=/x", msg, sizeof msg), -EINVAL);
    EXPECT_NE(std::string(msg).find("unknown argument 'sockett'"), std::string::npos) << msg;
    EXPECT_EQ(qrt_slurm_config_arg(&c, "socket=relative", msg, sizeof msg), -EINVAL);
    // A qrtd on another node (the network listener).
    EXPECT_EQ(qrt_slurm_config_arg(&c, "socket=tcp://qpu1:7470", msg, sizeof msg), 0) << msg;
    EXPECT_STREQ(c.socket, "tcp://qpu1:7470");
    EXPECT_EQ(qrt_slurm_config_arg(&c, "socket=tcp://qpu1", msg, sizeof msg), -EINVAL);
    EXPECT_NE(std::string(msg).find("tcp://HOST:PORT"), std::string::npos) << msg;
    EXPECT_EQ(qrt_slurm_config_arg(&c, "state_dir=tcp://qpu1:7470", msg, sizeof msg), -EINVAL);
    // The QPU node's isolated CPUs are not this node's: no cpuset check.
    ASSERT_EQ(qrt_slurm_config_arg(&c, "cpuset_check=yes", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_config_arg(&c, "socket=tcp://qpu1:7470", msg, sizeof msg), 0);
    EXPECT_EQ(qrt_slurm_checks_cpuset(&c), 0);
    ASSERT_EQ(qrt_slurm_config_arg(&c, "socket=/run/x/qrtd.sock", msg, sizeof msg), 0);
    EXPECT_EQ(qrt_slurm_checks_cpuset(&c), 1);
    EXPECT_EQ(qrt_slurm_config_arg(&c, "max_lease=10ms", msg, sizeof msg), -EINVAL);
    EXPECT_EQ(qrt_slurm_config_arg(&c, "cluster=a:b", msg, sizeof msg), -EINVAL);
    EXPECT_EQ(qrt_slurm_config_arg(&c, "noequals", msg, sizeof msg), -EINVAL);
}

TEST(spank_core, the_failure_message_says_why_what_was_asked_and_the_next_start) {
    qrt_slurm_request r{};
    r.duration_ns = 2'000'000;
    r.count = 2;
    r.not_before_ns = now;
    r.deadline_ns = now + 5 * s;
    char buf[QRT_SLURM_MSG];
    qrt_slurm_failure_message(&r, "no_fit", "no slot of duration_ns 2000000", now + 12 * s, now,
                              buf, sizeof buf);
    const std::string m(buf);
    EXPECT_NE(m.find("no QPU slot for this step"), std::string::npos) << m;
    EXPECT_NE(m.find("reason no_fit"), std::string::npos) << m;
    EXPECT_NE(m.find("2 QPUs x 2000000 ns"), std::string::npos) << m;
    EXPECT_NE(m.find("deadline: --qpu-deadline"), std::string::npos) << m;
    EXPECT_NE(m.find("the next possible start is 2027-01-15T08:00:12.000Z (in 12.0 s)"),
              std::string::npos)
        << m;
    qrt_slurm_failure_message(&r, "no_fit", "x", 0, now, buf, sizeof buf);
    EXPECT_NE(std::string(buf).find("knows no start"), std::string::npos) << buf;
}

}  // namespace

TEST(spank_core, qrtd_node_names_each_nodes_qrtd_and_entries_round_trip) {
    auto c = config();
    char msg[QRT_SLURM_MSG];
    ASSERT_EQ(qrt_slurm_config_arg(&c, "qrtd_node=tcp://%n:7470", msg, sizeof msg), 0) << msg;
    ASSERT_EQ(qrt_slurm_config_arg(&c, "qrtd_nodes=qpu[1-2]", msg, sizeof msg), 0) << msg;
    EXPECT_STREQ(c.node_list, "qpu[1-2]");
    char url[256];
    ASSERT_EQ(qrt_slurm_node_url(&c, "qpu2", url, sizeof url), 0);
    EXPECT_STREQ(url, "tcp://qpu2:7470");
    char tiny[8];
    EXPECT_EQ(qrt_slurm_node_url(&c, "qpu2", tiny, sizeof tiny), -ENOSPC);
    // Without %n every node would share one qrtd: that is socket=.
    EXPECT_EQ(qrt_slurm_config_arg(&c, "qrtd_node=tcp://qpu1:7470", msg, sizeof msg), -EINVAL);
    EXPECT_NE(std::string(msg).find("%n"), std::string::npos) << msg;
    EXPECT_EQ(qrt_slurm_config_arg(&c, "qrtd_node=/run/%n.sock", msg, sizeof msg), -EINVAL);
    EXPECT_EQ(qrt_slurm_config_arg(&c, "qrtd_nodes=", msg, sizeof msg), -EINVAL);
    ASSERT_EQ(qrt_slurm_config_arg(&c, "lease=30s", msg, sizeof msg), 0) << msg;
    EXPECT_EQ(c.heartbeat_lease_ns, 30'000'000'000);
    EXPECT_EQ(qrt_slurm_config_arg(&c, "lease=1s", msg, sizeof msg), -EINVAL);
    EXPECT_NE(std::string(msg).find("at least 3s"), std::string::npos) << msg;

    qrt_slurm_held a{};
    a.n = 1;
    a.member[0].id = 12;
    std::snprintf(a.member[0].qpu, sizeof a.member[0].qpu, "qpu1-q0");
    a.fencing_token = 7;
    qrt_slurm_held b{};
    b.n = 2;
    b.member[0].id = 3;
    b.member[1].id = 4;
    std::snprintf(b.member[0].qpu, sizeof b.member[0].qpu, "q0");
    std::snprintf(b.member[1].qpu, sizeof b.member[1].qpu, "q1");
    b.fencing_token = 9;
    char e1[256];
    char e2[256];
    ASSERT_EQ(qrt_slurm_node_entry_format("qpu1", &a, e1, sizeof e1), 0);
    ASSERT_EQ(qrt_slurm_node_entry_format("qpu2", &b, e2, sizeof e2), 0);
    EXPECT_STREQ(e1, "qpu1|12|7|qpu1-q0");
    const std::string both = std::string(e1) + ";" + e2;
    char node[64];
    qrt_slurm_held got{};
    ASSERT_EQ(qrt_slurm_node_entry_parse(both.c_str(), 1, node, sizeof node, &got), 0);
    EXPECT_STREQ(node, "qpu2");
    EXPECT_EQ(got.n, 2);
    EXPECT_EQ(got.member[1].id, 4u);
    EXPECT_STREQ(got.member[1].qpu, "q1");
    EXPECT_EQ(got.fencing_token, 9u);
    ASSERT_EQ(qrt_slurm_node_entry_parse(both.c_str(), 0, node, sizeof node, &got), 0);
    EXPECT_STREQ(node, "qpu1");
    EXPECT_EQ(got.member[0].id, 12u);
    EXPECT_EQ(qrt_slurm_node_entry_parse(both.c_str(), 2, node, sizeof node, &got), -ENOENT);
    EXPECT_EQ(qrt_slurm_node_entry_parse("qpu1|x|7|q", 0, node, sizeof node, &got), -EINVAL);
    EXPECT_EQ(qrt_slurm_node_entry_parse("qpu1|1|7", 0, node, sizeof node, &got), -EINVAL);
    EXPECT_EQ(qrt_slurm_node_entry_format("a|b", &a, e1, sizeof e1), -EINVAL);
}
