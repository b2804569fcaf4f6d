#include <gtest/gtest.h>

#include <cerrno>

#include "rtcore/restore_journal.hpp"
#include "tree_fixture.hpp"

using namespace qrt_test;
using rtcore::journal_record;
using rtcore::restore_journal;
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
    const journal_record rec{"file", {"/proc/irq/36/smp_affinity_list", "0-1\n"}};
    const auto line = rtcore::journal_format(rec);
    ASSERT_EQ(line.back(), '\n');
    auto back = rtcore::journal_parse(std::string_view(line).substr(0, line.size() - 1));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->kind, "file");
    EXPECT_EQ(back->fields, rec.fields);
    std::string bad = line.substr(0, line.size() - 1);
    bad[bad.size() - 2] = 'X';
    EXPECT_FALSE(rtcore::journal_parse(bad)) << "checksum did not catch a changed byte";
    EXPECT_FALSE(rtcore::journal_parse(line.substr(0, 20))) << "a torn line parsed";
}

TEST(journal, missing_state_dir_is_a_clear_error) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    auto j = restore_journal::open(fs, t.base() / "no-such-dir");
    ASSERT_FALSE(j);
    EXPECT_EQ(j.err().code, ENOENT);
    EXPECT_NE(j.err().message.find("no-such-dir"), std::string::npos) << j.err().message;
    EXPECT_NE(j.err().message.find("No such file or directory"), std::string::npos) << j.err().message;
    EXPECT_FALSE(fs::exists(t.base() / "no-such-dir"));
}

TEST(journal, keeps_only_the_first_original_of_a_path_across_reopen) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    const std::string p = "/proc/irq/36/smp_affinity_list";
    {
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j) << j.err().message;
        ASSERT_TRUE(j->save_file(fs, p));
        ASSERT_TRUE(fs.write(p, "0"));
        ASSERT_TRUE(j->save_file(fs, p));  // must not record "0" as the original
    }
    auto j = restore_journal::open(fs, t.state());
    ASSERT_TRUE(j);
    EXPECT_TRUE(j->existed());
    ASSERT_TRUE(j->save_file(fs, p));
    std::size_t files = 0;
    for (const auto& r : j->records()) {
        if (r.kind == "file") {
            ++files;
            EXPECT_EQ(r.fields[1], "0-1\n");
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
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_files(fs, {"/proc/irq/36/smp_affinity_list", "/proc/irq/default_smp_affinity"}));
    }
    ASSERT_TRUE(fs.write("/proc/irq/36/smp_affinity_list", "0"));
    ASSERT_TRUE(fs.write("/proc/irq/default_smp_affinity", "00000001"));
    auto r = rtcore::restore_from_journal(fs, tasks, t.state());
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete);
    EXPECT_TRUE(r->journal_removed);
    ASSERT_EQ(r->items.size(), 2U);
    EXPECT_EQ(r->items[0].what, "/proc/irq/default_smp_affinity");  // newest first
    EXPECT_EQ(r->items[0].line(), "restored /proc/irq/default_smp_affinity: 00000001 -> 3");
    EXPECT_EQ(first_difference(before, snapshot(t.root())), "");
    EXPECT_FALSE(fs::exists(t.journal()));
    auto again = rtcore::restore_from_journal(fs, tasks, t.state());
    ASSERT_TRUE(again);
    EXPECT_FALSE(again->journal_found);
    EXPECT_TRUE(again->complete);
}

TEST(journal, a_torn_last_record_is_ignored_and_cut_before_the_next_append) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    {
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/36/smp_affinity_list"));
    }
    ASSERT_TRUE(fs.write("/proc/irq/36/smp_affinity_list", "0"));
    // What SIGKILL in the middle of the next append leaves behind.
    const auto full = rtcore::journal_format(journal_record{"file", {"/proc/irq/41/smp_affinity_list", "0-1\n"}});
    { std::ofstream(t.journal(), std::ios::app | std::ios::binary) << full.substr(0, full.size() / 2); }
    {
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j) << j.err().message;
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/42/smp_affinity_list"));
    }
    std::vector<std::string> problems;
    auto recs = restore_journal::load(t.state(), &problems);
    ASSERT_TRUE(recs);
    EXPECT_TRUE(problems.empty()) << problems.front();
    EXPECT_EQ(recs->size(), 3U);  // header, irq 36, irq 42
    // And a torn tail with no reopen is tolerated by restore itself.
    { std::ofstream(t.journal(), std::ios::app | std::ios::binary) << "deadbeef file /pro"; }
    auto r = rtcore::restore_from_journal(fs, tasks, t.state());
    ASSERT_TRUE(r) << r.err().message;
    EXPECT_TRUE(r->complete);
    EXPECT_EQ(read_file(t.root() / "proc/irq/36/smp_affinity_list"), "0-1\n");
}

TEST(journal, a_corrupt_middle_record_makes_restore_incomplete_and_keeps_the_journal) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    {
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/36/smp_affinity_list"));
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/41/smp_affinity_list"));
    }
    auto text = read_file(t.journal());
    const auto pos = text.find("/proc/irq/36");
    ASSERT_NE(pos, std::string::npos);
    text[pos + 10] = '9';  // bit rot in a line that is not the last
    write_file(t.journal(), text);
    auto r = rtcore::restore_from_journal(fs, tasks, t.state());
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->complete);
    EXPECT_FALSE(r->journal_removed);
    ASSERT_EQ(r->problems.size(), 1U);
    EXPECT_EQ(r->problems[0], "journal line 2 is corrupt (bad checksum or format); it was skipped");
    EXPECT_TRUE(fs::exists(t.journal()));
    // apply refuses to build on a corrupt journal
    auto j = restore_journal::open(fs, t.state());
    ASSERT_FALSE(j);
    EXPECT_NE(j.err().message.find("journal line 2 is corrupt"), std::string::npos) << j.err().message;
}

TEST(journal, a_journal_from_an_earlier_boot_restores_nothing) {
    tree_copy t("vm2-v1");
    rtcore::host_fs fs(t.root());
    rtcore::fake_task_ops tasks;
    {
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j);
        ASSERT_TRUE(j->save_file(fs, "/proc/irq/36/smp_affinity_list"));
    }
    ASSERT_TRUE(fs.write("/proc/irq/36/smp_affinity_list", "1"));  // set by the admin after reboot
    write_file(t.root() / "proc/sys/kernel/random/boot_id", "00000000-1111-2222-3333-444444444444\n");
    auto r = rtcore::restore_from_journal(fs, tasks, t.state());
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
        auto j = restore_journal::open(fs, t.state());
        ASSERT_TRUE(j);
        auto rec = [&](pid_t tid, const char* orig, const char* set) {
            return journal_record{"aff", {std::to_string(tid), std::to_string(tasks.tasks().at(tid).info.start_ticks),
                                          orig, set}};
        };
        ASSERT_TRUE(j->append({rec(1, "0-3", "0-2"), rec(500, "0-3", "0-2"), rec(501, "3", "0")}));
    }
    ASSERT_TRUE(tasks.set_affinity(1, {0, 1, 2}));
    ASSERT_TRUE(tasks.set_affinity(500, {1}));  // changed by the task itself since
    tasks.remove_task(501);                      // exited
    auto r = rtcore::restore_from_journal(fs, tasks, t.state());
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
