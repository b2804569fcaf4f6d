#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

#include "rtcore/restore_journal.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::journal_record;
using rtcore::restore_journal;
namespace rec = rtcore::rec;
using outcome = rtcore::restore_item::outcome;

TEST(journal_format, escapes_every_byte_and_round_trips) {
    std::string all;
    for (int c = 0; c < 256; ++c) {
        all += static_cast<char>(c);
    }
    for (const std::string& s : {std::string(), std::string("0-1\n"), std::string("~%  x"), all}) {
        const auto esc = rtcore::journal_escape(s);
        EXPECT_EQ(esc.find_first_of(" \n"), std::string::npos) << "escaped field holds a separator";
        auto back = rtcore::journal_unescape(esc);
        ASSERT_TRUE(back) << back.err().message;
        EXPECT_EQ(*back, s);
    }
    EXPECT_EQ(rtcore::journal_escape(""), "~");
    EXPECT_EQ(rtcore::journal_escape("0-1\n"), "0-1%0a");
}

TEST(journal_format, a_line_parses_back_and_a_flipped_byte_is_rejected) {
    const journal_record r = rec::file{"/proc/irq/36/smp_affinity_list", "0-1\n"};
    const auto line = rtcore::journal_format(r);
    ASSERT_EQ(line.back(), '\n');
    EXPECT_EQ(line.substr(9), "file /proc/irq/36/smp_affinity_list 0-1%0a\n");
    auto back = rtcore::journal_parse(std::string_view(line).substr(0, line.size() - 1));
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_TRUE(*back == r);
    std::string bad = line.substr(0, line.size() - 1);
    bad[bad.size() - 2] = 'X';
    auto flipped = rtcore::journal_parse(bad);
    ASSERT_FALSE(flipped) << "checksum did not catch a changed byte";
    EXPECT_EQ(flipped.err().code, EBADMSG);
    EXPECT_FALSE(rtcore::journal_parse(line.substr(0, 20))) << "a torn line parsed";
}

// Each kind: the typed record survives format and parse, and its text is
// what the header comment of journal_record.hpp says.
TEST(journal_format, every_record_kind_round_trips_with_typed_fields) {
    const std::vector<std::pair<journal_record, std::string>> cases = {
        {rec::header{2, "148e24da-ef85-4d2b-baf4-da6d1156975d", "/"},
         "journal 2 148e24da-ef85-4d2b-baf4-da6d1156975d /"},
        {rec::apply{{1}, {0}, rec::applier::run}, "apply 1 0 run"},
        {rec::method{rtcore::isolation_method::cgroup_v1_cpuset}, "method cgroup-v1-cpuset"},
        {rec::managed{122}, "managed 122"},
        {rec::file{"/proc/irq/default_smp_affinity", "3\n"}, "file /proc/irq/default_smp_affinity 3%0a"},
        {rec::ctl{"/sys/fs/cgroup/cgroup.subtree_control", "cpuset"}, "ctl /sys/fs/cgroup/cgroup.subtree_control cpuset"},
        {rec::mkcg{"/sys/fs/cgroup/cpuset/qrt-isolated", "/sys/fs/cgroup/cpuset"},
         "mkcg /sys/fs/cgroup/cpuset/qrt-isolated /sys/fs/cgroup/cpuset"},
        {rec::cg{812, 4711, "/sys/fs/cgroup/cpuset", rtcore::cpu_set{0, 1}}, "cg 812 4711 /sys/fs/cgroup/cpuset 0-1"},
        {rec::cg{813, 1, "/sys/fs/cgroup/cpuset", std::nullopt}, "cg 813 1 /sys/fs/cgroup/cpuset ~"},
        {rec::aff{900, 77, {0, 1, 2, 3}, {0, 1}}, "aff 900 77 0-3 0-1"},
        {rec::knob{"/sys/devices/virtual/workqueue/cpumask", "3\n", "00000001"},
         "knob /sys/devices/virtual/workqueue/cpumask 3%0a 00000001"},
        {rec::knob{"/proc/sys/vm/stat_interval", "", "10"}, "knob /proc/sys/vm/stat_interval ~ 10"},
        {rec::nomove{19, 1019}, "nomove 19 1019"},
    };
    ASSERT_EQ(cases.size(), std::variant_size_v<journal_record> + 2) << "a record kind has no case here";
    for (const auto& [r, text] : cases) {
        const auto line = rtcore::journal_format(r);
        EXPECT_EQ(line.substr(9), text + "\n");
        auto back = rtcore::journal_parse(std::string_view(line).substr(0, line.size() - 1));
        ASSERT_TRUE(back) << text << ": " << back.err().message;
        EXPECT_TRUE(*back == r) << text;
    }
}

// A line whose checksum holds but whose fields are out of form is not rot:
// it is refused with what is wrong, never read by index.
TEST(journal_format, checksummed_lines_with_bad_fields_are_refused_with_the_reason) {
    auto with_crc = [](const std::string& body) {
        char crc[9];
        std::snprintf(crc, sizeof crc, "%08x", rtcore::journal_crc32(body));
        return std::string(crc) + " " + body;
    };
    const std::pair<std::string, std::string> cases[] = {
        {"file /proc/irq/36/smp_affinity_list", "file record: has 1 fields, expected 2"},
        {"file relative/path 0", "file record: path \"relative/path\" is not a canonical absolute path"},
        {"file /proc/irq/../../etc/shadow x", "file record: path \"/proc/irq/../../etc/shadow\" is not a canonical absolute path"},
        {"file /proc//irq/1/smp_affinity x", "file record: path \"/proc//irq/1/smp_affinity\" is not a canonical absolute path"},
        {"cg -5 1 /sys/fs/cgroup/cpuset 0", "cg record: tid \"-5\" is not a thread id"},
        {"cg 5 x /sys/fs/cgroup/cpuset 0", "cg record: start time \"x\" is not a number of clock ticks"},
        {"aff 5 1 0-3 3-1", "aff record: affinity set: cpu list \"3-1\": range \"3-1\" runs backwards"},
        {"aff 5 1 0-3 ~", "aff record: affinity set is empty"},
        {"apply 1 0 somebody", "apply record: applier \"somebody\" is not host-apply or run"},
        {"method magic", "method record: \"magic\" is not an isolation method"},
        {"ctl /sys/fs/cgroup/cgroup.subtree_control CPU!", "ctl record: controller \"CPU!\" is not a controller name"},
        {"chmod /etc/shadow 777", "unknown record kind \"chmod\""},
        {"file /proc/irq/1/smp_affinity %zz", "journal field: bad escape"},
        {"file /proc/irq/1/smp_affinity ab%4", "journal field: truncated escape"},
    };
    for (const auto& [body, why] : cases) {
        auto r = rtcore::journal_parse(with_crc(body));
        ASSERT_FALSE(r) << body;
        EXPECT_EQ(r.err().code, EINVAL) << body;
        EXPECT_EQ(r.err().message, why) << body;
    }
}

TEST(journal, a_journal_directory_whose_parent_is_missing_is_a_clear_error) {
    tree_copy t("vm2-v1");
    auto d = rtcore::journal_dir::open(t.base() / "no-such-dir" / "journal", {});
    ASSERT_FALSE(d);
    EXPECT_EQ(d.err().code, ENOENT);
    EXPECT_NE(d.err().message.find("no-such-dir"), std::string::npos) << d.err().message;
    EXPECT_NE(d.err().message.find("No such file or directory"), std::string::npos) << d.err().message;
    EXPECT_FALSE(fs::exists(t.base() / "no-such-dir"));
}

TEST(journal, the_journal_directory_is_created_private_to_its_user) {
    tree_copy t("vm2-v1");
    const auto old = ::umask(0);  // even with a lax umask
    auto d = rtcore::journal_dir::open(t.journal_dir(), {});
    ::umask(old);
    ASSERT_TRUE(d) << d.err().message;
    struct stat st {};
    ASSERT_EQ(::stat(t.journal_dir().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777U, 0700U);
    EXPECT_EQ(st.st_uid, ::geteuid());
    ASSERT_EQ(::stat((t.journal_dir() / "host.lock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777U, 0600U);
}

TEST(journal, keeps_only_the_first_original_of_a_path_across_reopen) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    const std::string p = "/proc/irq/36/smp_affinity_list";
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j) << j.err().message;
        ASSERT_TRUE(j->save_file(fs, p));
        ASSERT_TRUE(fs.write(p, "0"));
        ASSERT_TRUE(j->save_file(fs, p));  // must not record "0" as the original
    }
    auto j = open_journal(t, fs);
    ASSERT_TRUE(j);
    EXPECT_TRUE(j->existed());
    ASSERT_TRUE(j->save_file(fs, p));
    std::size_t files = 0;
    for (const auto& r : j->records()) {
        if (const auto* f = std::get_if<rec::file>(&r)) {
            ++files;
            EXPECT_EQ(f->original, "0-1\n");
        }
    }
    EXPECT_EQ(files, 1U);
}

TEST(journal, restore_puts_back_bytes_is_idempotent_and_removes_the_journal) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    const auto before = snapshot(t.root());
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_files(fs, {"/proc/irq/36/smp_affinity_list", "/proc/irq/default_smp_affinity"}));
    }
    ASSERT_TRUE(fs.write("/proc/irq/36/smp_affinity_list", "0"));
    ASSERT_TRUE(fs.write("/proc/irq/default_smp_affinity", "00000001"));
    auto r = restore_journal_in(t, fs, tasks);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete);
    EXPECT_TRUE(r->journal_removed);
    ASSERT_EQ(r->items.size(), 2U);
    EXPECT_EQ(r->items[0].what, "/proc/irq/default_smp_affinity");  // newest first
    EXPECT_EQ(r->items[0].line(), "restored /proc/irq/default_smp_affinity: 00000001 -> 3");
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_FALSE(fs::exists(t.journal()));
    auto again = restore_journal_in(t, fs, tasks);
    ASSERT_TRUE(again);
    EXPECT_FALSE(again->journal_found);
    EXPECT_TRUE(again->complete);
}

TEST(journal, a_torn_last_record_is_ignored_and_cut_before_the_next_append) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/36/smp_affinity_list"));
    }
    ASSERT_TRUE(fs.write("/proc/irq/36/smp_affinity_list", "0"));
    // What SIGKILL in the middle of the next append leaves behind.
    const auto full = rtcore::journal_format(rec::file{"/proc/irq/41/smp_affinity_list", "0-1\n"});
    { std::ofstream(t.journal(), std::ios::app | std::ios::binary) << full.substr(0, full.size() / 2); }
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j) << j.err().message;
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/42/smp_affinity_list"));
    }
    auto recs = load_journal(t, fs);
    ASSERT_TRUE(recs);
    EXPECT_TRUE(recs->problems.empty()) << recs->problems.front();
    EXPECT_EQ(recs->records.size(), 3U);  // header, irq 36, irq 42
    // And a torn tail with no reopen is tolerated by restore itself.
    { std::ofstream(t.journal(), std::ios::app | std::ios::binary) << "deadbeef file /pro"; }
    auto r = restore_journal_in(t, fs, tasks);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0-1\n");
}

TEST(journal, a_corrupt_middle_record_makes_restore_incomplete_and_keeps_the_journal) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/36/smp_affinity_list"));
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/41/smp_affinity_list"));
    }
    auto text = read_file(t.journal());
    const auto pos = text.find("/proc/irq/36");
    ASSERT_NE(pos, std::string::npos);
    text[pos + 10] = '9';  // bit rot in a line that is not the last
    write_file(t.journal(), text);
    auto r = restore_journal_in(t, fs, tasks);
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->complete);
    EXPECT_FALSE(r->journal_removed);
    ASSERT_EQ(r->problems.size(), 1U);
    EXPECT_EQ(r->problems[0], "journal line 2 is corrupt (bad checksum); it was skipped");
    EXPECT_TRUE(fs::exists(t.journal()));
    // apply refuses to build on a corrupt journal
    auto j = open_journal(t, fs);
    ASSERT_FALSE(j);
    EXPECT_NE(j.err().message.find("journal line 2 is corrupt"), std::string::npos) << j.err().message;
}

TEST(journal, a_journal_from_an_earlier_boot_restores_nothing) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/36/smp_affinity_list"));
    }
    ASSERT_TRUE(fs.write("/proc/irq/36/smp_affinity_list", "1"));  // set by the admin after reboot
    write_file(t.root() / "proc/sys/kernel/random/boot_id", "00000000-1111-2222-3333-444444444444\n");
    auto r = restore_journal_in(t, fs, tasks);
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->other_boot);
    EXPECT_TRUE(r->items.empty());
    EXPECT_TRUE(r->journal_removed);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "1");
}

TEST(journal, task_records_skip_exited_and_reused_tids_and_respect_later_changes) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, {0, 1, 2, 3});
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        auto aff = [&](pid_t tid, rtcore::cpu_set orig, rtcore::cpu_set set) -> journal_record {
            return rec::aff{tid, tasks.tasks().at(tid).info.start_ticks, orig, set};
        };
        ASSERT_TRUE(j->append({aff(1, {0, 1, 2, 3}, {0, 1, 2}), aff(500, {0, 1, 2, 3}, {0, 1, 2}), aff(501, {3}, {0})}));
    }
    ASSERT_TRUE(tasks.set_affinity(1, {0, 1, 2}));
    ASSERT_TRUE(tasks.set_affinity(500, {1}));  // changed by the task itself since
    tasks.remove_task(501);                      // exited
    auto r = restore_journal_in(t, fs, tasks);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete);
    ASSERT_EQ(r->items.size(), 3U);
    EXPECT_EQ(r->items[0].result, outcome::gone);
    EXPECT_EQ(r->items[1].result, outcome::skipped);
    EXPECT_EQ(r->items[1].line(),
              "skipped task 500 (postgres): affinity changed by someone else since (now 1); left as is");
    EXPECT_EQ(r->items[2].result, outcome::restored);
    EXPECT_EQ(tasks.tasks().at(1).affinity, (rtcore::cpu_set{0, 1, 2, 3}));
}

// The journal never grows past what load reads.  A batch
// that would take it past its limit is refused whole, and what is there
// still loads and restores.
TEST(journal, an_append_past_the_size_limit_is_refused_whole_and_the_journal_still_loads) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    constexpr std::size_t limit = 4096;
    std::size_t appended = 0;
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        j->set_limits(limit, limit);
        rtcore::status st = rtcore::ok();
        for (pid_t tid = 100; st && tid < 10000; ++tid) {
            st = j->append(rec::aff{tid, 1000U + static_cast<std::uint64_t>(tid), {0, 1, 2, 3}, {0, 1}});
            appended += st ? 1U : 0U;
        }
        ASSERT_FALSE(st) << "the limit never refused an append";
        EXPECT_EQ(st.err().code, EFBIG);
        EXPECT_NE(st.err().message.find("past its 4096-byte limit"), std::string::npos) << st.err().message;
        EXPECT_NE(st.err().message.find("nothing was appended"), std::string::npos) << st.err().message;
        const std::vector<journal_record> batch = {rec::aff{20000, 21000, {0, 1, 2, 3}, {0, 1}},
                                                   rec::aff{20001, 21001, {0, 1, 2, 3}, {0, 1}}};
        const auto before = j->size();
        EXPECT_FALSE(j->append(batch));
        EXPECT_EQ(j->size(), before);
        EXPECT_EQ(j->bytes(), std::filesystem::file_size(t.journal()));
    }
    EXPECT_LE(std::filesystem::file_size(t.journal()), limit);
    EXPECT_GT(std::filesystem::file_size(t.journal()), limit - 64) << "the limit refused early";
    auto loaded = load_journal(t, fs);
    ASSERT_TRUE(loaded) << loaded.err().message;
    EXPECT_EQ(loaded->records.size(), appended + 1);  // the header
    rtcore::fake_task_ops none;
    auto r = restore_journal_in(t, fs, none);
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete);
    EXPECT_TRUE(r->journal_removed);
}

// Compaction drops exactly the records restore would report as gone: a
// thread that exited, a tid now naming another thread; a running thread's
// record and every other kind stay, on disk as in memory, and a thread on a
// reused tid gets a record of its own.
TEST(journal, compaction_drops_the_records_of_exited_threads_only) {
    tree_copy t("host4-nocg");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    add_plain_tasks(tasks, {0, 1, 2, 3});
    tasks.add_task(600, "short", {0, 1, 2, 3}, "");
    tasks.add_task(601, "reused", {0, 1, 2, 3}, "");
    tasks.add_task(602, "kworker", {2}, "", true, true);
    auto start = [&](pid_t tid) { return tasks.tasks().at(tid).info.start_ticks; };
    {
        auto j = open_journal(t, fs);
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/16/smp_affinity_list"));
        ASSERT_TRUE(j->append({rec::aff{500, start(500), {0, 1, 2, 3}, {0, 1}},
                               rec::aff{600, start(600), {0, 1, 2, 3}, {0, 1}},
                               rec::aff{601, start(601), {0, 1, 2, 3}, {0, 1}}, rec::nomove{602, start(602)},
                               rec::method{rtcore::isolation_method::affinity_fence}}));
        const auto old_601 = start(601);
        tasks.remove_task(600);
        tasks.remove_task(602);
        tasks.reuse_tid(601, 99999);
        EXPECT_TRUE(j->has_task(601, old_601));
        EXPECT_FALSE(j->has_task(601, 99999)) << "a new thread on a reused tid has no record";
        EXPECT_TRUE(j->compact(fs, tasks)) << "below its compaction size: left as it is";
        EXPECT_TRUE(j->has_task(600));
        j->set_limits(rtcore::journal_max_bytes, 0);
        ASSERT_TRUE(j->compact(fs, tasks));
        EXPECT_FALSE(j->has_task(600));
        EXPECT_FALSE(j->has_task(601)) << "the record of the thread that had tid 601 before";
        EXPECT_FALSE(j->has_task(601, 99999)) << "the new thread on tid 601 is not journaled yet";
        EXPECT_TRUE(j->has_task(500, start(500)));
        EXPECT_TRUE(j->has_file("/proc/irq/16/smp_affinity_list"));
        EXPECT_EQ(j->bytes(), std::filesystem::file_size(t.journal()));
        ASSERT_TRUE(j->append(rec::aff{601, 99999, {0, 1, 2, 3}, {0, 1}})) << "appends go to the new file";
        EXPECT_EQ(j->bytes(), std::filesystem::file_size(t.journal()));
    }
    auto loaded = load_journal(t, fs);
    ASSERT_TRUE(loaded) << loaded.err().message;
    std::vector<std::string> kinds;
    for (const auto& r : loaded->records) {
        kinds.push_back(rtcore::describe(r));
    }
    ASSERT_EQ(kinds.size(), 5U) << ::testing::PrintToString(kinds);
    EXPECT_EQ(std::string(rtcore::kind_of(loaded->records[0])), "journal");
    EXPECT_EQ(std::string(rtcore::kind_of(loaded->records[1])), "file");
    EXPECT_TRUE(loaded->records[2] == journal_record(rec::aff{500, start(500), {0, 1, 2, 3}, {0, 1}}));
    EXPECT_EQ(std::string(rtcore::kind_of(loaded->records[3])), "method");
    EXPECT_TRUE(loaded->records[4] == journal_record(rec::aff{601, 99999, {0, 1, 2, 3}, {0, 1}}));
}
