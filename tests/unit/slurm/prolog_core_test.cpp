// What qrt-slurm-prolog takes from the core (tools/integrations/slurm/
// qrt_slurm_job.c, qrt_slurm.c): a job comment's qpu: request, read by the
// same parser as spank_qrt's --qpu-* options; the request it becomes, keyed
// by the job; the record root keeps per job, which no field can add a line
// to; scontrol's times.  These are the cases the Python prolog had, now
// asked of the one core both programs use.

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "qrt_slurm.h"

namespace {

constexpr std::int64_t s = 1'000'000'000;
constexpr std::int64_t now = 1'800'000'000 * s;  // 2027-01-15

struct parsed {
    int rc;
    qrt_slurm_options o;
    std::string msg;
};

parsed comment(const char* text) {
    parsed p{};
    char msg[QRT_SLURM_MSG] = "";
    p.rc = qrt_slurm_comment_options(text, &p.o, msg, sizeof msg);
    p.msg = msg;
    return p;
}

TEST(prolog_core, a_comment_request_takes_every_key_as_its_option_does) {
    const auto p = comment("qpu:duration=2ms,count=2,deadline=+30s,not-before=@1800000010.5,"
                           "min-fidelity=0.95,priority=-3");
    ASSERT_EQ(p.rc, 1) << p.msg;
    EXPECT_TRUE(p.o.from_comment);
    EXPECT_EQ(p.o.duration_ns, 2'000'000);
    EXPECT_EQ(p.o.count, 2);
    EXPECT_TRUE(p.o.deadline_set && p.o.deadline_relative);
    EXPECT_EQ(p.o.deadline_ns, 30 * s);
    EXPECT_TRUE(p.o.not_before_set && !p.o.not_before_relative);
    EXPECT_EQ(p.o.not_before_ns, 1'800'000'010 * s + 500'000'000);
    EXPECT_DOUBLE_EQ(p.o.min_fidelity, 0.95);
    EXPECT_TRUE(p.o.priority_set);
    EXPECT_EQ(p.o.priority, -3);
}

TEST(prolog_core, the_request_is_the_first_qpu_word_anywhere_in_the_comment) {
    auto p = comment("nightly run qpu:duration=5ms please");
    ASSERT_EQ(p.rc, 1) << p.msg;
    EXPECT_EQ(p.o.duration_ns, 5'000'000);
    EXPECT_EQ(p.o.count, 1);
    // Not a word of its own, or nothing after it: no request at all.
    for (const char* none : {"", "no request", "myqpu:duration=2ms", "qpu: duration=2ms", "qpu:"}) {
        EXPECT_EQ(comment(none).rc, 0) << "'" << none << "'";
    }
    EXPECT_EQ(qrt_slurm_comment_options(nullptr, &p.o, nullptr, 0), 0);
}

TEST(prolog_core, a_bad_comment_names_the_item_and_the_keys) {
    const std::pair<const char*, const char*> bad[] = {
        {"qpu:count=2", "duration is required (qpu:duration=2ms)"},
        {"qpu:duration=2ms,fast", "'fast' is not key=value"},
        {"qpu:duration=2ms,count=", "'count=' is not key=value"},
        {"qpu:duration=2ms,,count=2", "'' is not key=value"},
        {"qpu:duration=2ms,colour=red", "unknown key 'colour' (duration, count, deadline"},
        {"qpu:duration=soon", "duration: 'soon' is not a duration"},
        {"qpu:duration=2ms,count=65", "count: '65' is not an integer in [1, 64]"},
        {"qpu:duration=2ms,min-fidelity=1.5", "min-fidelity: '1.5' is not a number in (0, 1]"},
        {"qpu:duration=2ms,priority=high", "priority: 'high' is not an integer"},
        {"qpu:duration=2ms,deadline=30s", "deadline: '30s' is not a time"},
    };
    for (const auto& [text, want] : bad) {
        const auto p = comment(text);
        EXPECT_EQ(p.rc, -EINVAL) << text;
        EXPECT_NE(p.msg.find(want), std::string::npos) << text << ": " << p.msg;
        EXPECT_EQ(p.msg.find("--qpu-"), std::string::npos) << "a comment has no options: " << p.msg;
    }
}

TEST(prolog_core, a_comment_request_becomes_the_same_request_as_the_options_and_says_job) {
    qrt_slurm_config cfg;
    qrt_slurm_config_default(&cfg);
    auto p = comment("qpu:duration=2ms,deadline=+30s");
    ASSERT_EQ(p.rc, 1);
    qrt_slurm_request r;
    char msg[QRT_SLURM_MSG];
    ASSERT_EQ(qrt_slurm_build_request(&p.o, &cfg, now, now + 600 * s, &r, msg, sizeof msg), 0) << msg;
    EXPECT_EQ(r.not_before_ns, now + 2 * s);
    EXPECT_EQ(r.deadline_ns, now + 30 * s);
    EXPECT_EQ(r.lease_ns, 600 * s);
    EXPECT_TRUE(r.from_comment);
    // The same request given as --qpu-* options.
    qrt_slurm_options o;
    qrt_slurm_options_default(&o);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-duration", "2ms", msg, sizeof msg), 0);
    ASSERT_EQ(qrt_slurm_option(&o, "qpu-deadline", "+30s", msg, sizeof msg), 0);
    qrt_slurm_request r2;
    ASSERT_EQ(qrt_slurm_build_request(&o, &cfg, now, now + 600 * s, &r2, msg, sizeof msg), 0);
    EXPECT_EQ(r2.not_before_ns, r.not_before_ns);
    EXPECT_EQ(r2.deadline_ns, r.deadline_ns);
    EXPECT_EQ(r2.lease_ns, r.lease_ns);

    qrt_slurm_failure_message(&r, "no_fit", "no slot", 0, now, msg, sizeof msg);
    EXPECT_NE(std::string(msg).find("qrt: no QPU slot for this job: no slot (reason no_fit)"),
              std::string::npos)
        << msg;
    EXPECT_NE(std::string(msg).find("(deadline: the comment's deadline)"), std::string::npos) << msg;

    p = comment("qpu:duration=2ms,deadline=@1700000000");
    ASSERT_EQ(p.rc, 1);
    EXPECT_EQ(qrt_slurm_build_request(&p.o, &cfg, now, 0, &r, msg, sizeof msg), -ERANGE);
    EXPECT_NE(std::string(msg).find("the comment's deadline 2023-11-14T22:13:20.000Z is already past"),
              std::string::npos)
        << msg;
}

TEST(prolog_core, the_job_key_names_cluster_and_job_and_refuses_a_name_that_breaks_lines) {
    char key[160];
    ASSERT_EQ(qrt_slurm_job_key("lab", 42, key, sizeof key), 0);
    EXPECT_STREQ(key, "slurm:lab:42.job");
    ASSERT_EQ(qrt_slurm_job_key("", 42, key, sizeof key), 0);
    EXPECT_STREQ(key, "slurm:-:42.job");
    EXPECT_EQ(qrt_slurm_job_key("lab\nids=7", 42, key, sizeof key), -EINVAL);
    EXPECT_STREQ(key, "");
    EXPECT_TRUE(qrt_slurm_key_is_job("slurm:lab:42.job", "lab", 42));
}

qrt_slurm_job_record held_record() {
    qrt_slurm_job_record r{};
    r.held.n = 2;
    r.held.member[0].id = 11;
    std::strcpy(r.held.member[0].qpu, "qpu0");
    r.held.member[1].id = 12;
    std::strcpy(r.held.member[1].qpu, "qpu1");
    r.held.fencing_token = 5;
    r.held.start_ns = now + 2 * s;
    r.held.end_ns = now + 2 * s + 2'000'000;
    r.held.lease_expires_ns = now + 600 * s;
    std::strcpy(r.held.key, "slurm:lab:42.job");
    std::strcpy(r.socket, "/run/qrtd/qrtd.sock");
    return r;
}

TEST(prolog_core, a_job_record_round_trips_held_or_failed) {
    const auto r = held_record();
    char text[4096];
    ASSERT_EQ(qrt_slurm_job_record_format(&r, text, sizeof text), 0);
    qrt_slurm_job_record back;
    ASSERT_EQ(qrt_slurm_job_record_parse(text, &back), 0) << text;
    EXPECT_EQ(back.held.n, 2);
    EXPECT_EQ(back.held.member[1].id, 12U);
    EXPECT_STREQ(back.held.member[1].qpu, "qpu1");
    EXPECT_EQ(back.held.fencing_token, 5U);
    EXPECT_EQ(back.held.start_ns, r.held.start_ns);
    EXPECT_EQ(back.held.lease_expires_ns, r.held.lease_expires_ns);
    EXPECT_STREQ(back.held.key, "slurm:lab:42.job");
    EXPECT_STREQ(back.socket, "/run/qrtd/qrtd.sock");
    EXPECT_STREQ(back.reason, "");

    qrt_slurm_job_record f{};
    std::strcpy(f.held.key, "slurm:lab:43.job");
    std::strcpy(f.reason, "no_fit");
    std::strcpy(f.error, "qrt: no QPU slot for this job:\nno slot\t(reason no_fit)");
    ASSERT_EQ(qrt_slurm_job_record_format(&f, text, sizeof text), 0);
    ASSERT_EQ(qrt_slurm_job_record_parse(text, &back), 0) << text;
    EXPECT_EQ(back.held.n, 0);
    EXPECT_STREQ(back.held.key, "slurm:lab:43.job");
    EXPECT_STREQ(back.reason, "no_fit");
    // The error is one line: its control characters are spaces.
    EXPECT_STREQ(back.error, "qrt: no QPU slot for this job: no slot (reason no_fit)");
}

// Root writes the record and its Epilog acts on it: nothing in a field
// (qrtd's message, a QPU name, a key) adds a line, and a line added by hand
// (a field twice, an unknown one, a failed record with ids) is refused.
TEST(prolog_core, a_job_record_field_cannot_add_a_line_and_a_damaged_record_is_refused) {
    auto r = held_record();
    char text[4096];
    std::strcpy(r.socket, "/run/qrtd.sock\nids=7");
    EXPECT_EQ(qrt_slurm_job_record_format(&r, text, sizeof text), -EINVAL);
    EXPECT_STREQ(text, "");
    r = held_record();
    std::strcpy(r.held.member[0].qpu, "q\nfencing_token=9");
    EXPECT_EQ(qrt_slurm_job_record_format(&r, text, sizeof text), -EINVAL);
    r = held_record();
    r.socket[0] = '\0';
    EXPECT_EQ(qrt_slurm_job_record_format(&r, text, sizeof text), -EINVAL);

    qrt_slurm_job_record f{};
    std::strcpy(f.held.key, "slurm:lab:43.job");
    std::strcpy(f.reason, "no_fit\nids=7");
    EXPECT_EQ(qrt_slurm_job_record_format(&f, text, sizeof text), -EINVAL);
    std::strcpy(f.reason, "no_fit");
    std::strcpy(f.error, "x\nids=7\nfencing_token=9\nsocket=/tmp/evil.sock");
    ASSERT_EQ(qrt_slurm_job_record_format(&f, text, sizeof text), 0);
    qrt_slurm_job_record back;
    ASSERT_EQ(qrt_slurm_job_record_parse(text, &back), 0) << text;
    EXPECT_EQ(back.held.n, 0) << text;
    EXPECT_STREQ(back.socket, "");

    const auto held = held_record();
    ASSERT_EQ(qrt_slurm_job_record_format(&held, text, sizeof text), 0);
    const std::string good(text);
    for (const std::string& bad : {
             good + "socket=/tmp/evil.sock\n",   // a field twice
             good + "ids=7\n",                   // a held field twice
             good + "surprise=1\n",              // unknown
             good + "reason=no_fit\nerror=x\n",  // held and failed at once
             std::string("key=k\nreason=no_fit\nerror=x\nids=7\n"),  // failed, with ids
             std::string("key=k\nreason=no_fit\n"),                  // failed, no error
             std::string("key=k\nids=1\nfencing_token=1\n"),         // held, no socket
             std::string(""),
         }) {
        EXPECT_EQ(qrt_slurm_job_record_parse(bad.c_str(), &back), -EINVAL) << bad;
    }
}

TEST(prolog_core, scontrol_times_are_read_as_calendar_fields_or_not_at_all) {
    const char* out =
        "JobId=42 JobName=x UserId=nobody(65534) SubmitTime=2026-12-01T04:29:00 "
        "StartTime=2026-12-01T04:30:31 EndTime=2026-12-01T04:35:31 Deadline=N/A\n";
    std::tm tm{};
    ASSERT_EQ(qrt_slurm_scontrol_time(out, "StartTime", &tm), 0);
    EXPECT_EQ(tm.tm_year, 126);
    EXPECT_EQ(tm.tm_mon, 11);
    EXPECT_EQ(tm.tm_mday, 1);
    EXPECT_EQ(tm.tm_hour, 4);
    EXPECT_EQ(tm.tm_min, 30);
    EXPECT_EQ(tm.tm_sec, 31);
    ASSERT_EQ(qrt_slurm_scontrol_time(out, "EndTime", &tm), 0);
    EXPECT_EQ(tm.tm_min, 35);
    EXPECT_EQ(qrt_slurm_scontrol_time(out, "Deadline", &tm), -ENOENT);
    EXPECT_EQ(qrt_slurm_scontrol_time("StartTime=Unknown EndTime=Unknown", "StartTime", &tm), -ENOENT);
    EXPECT_EQ(qrt_slurm_scontrol_time("XStartTime=2026-12-01T04:30:31", "StartTime", &tm), -ENOENT);
    EXPECT_EQ(qrt_slurm_scontrol_time("", "StartTime", &tm), -ENOENT);
}

}  // namespace
