// The qrtd binary, end to end.  Each test runs the real executable and
// checks its exit code and what it printed.  Host-changing commands run on
// COPIES of the fake trees under tests/data/trees; the one test on the real
// host needs root, skips otherwise, and restores in TearDown if it fails.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sys/stat.h>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "qrt_test/process.hpp"
#include "rtcore/task_ops.hpp"

namespace fs = std::filesystem;

namespace {

const std::string qrtd = QRTD_BINARY;
const std::string demo = QRT_SOURCE_DIR "/config/demo.toml";
const std::string trees = QRT_TEST_DATA_DIR "/trees";

struct run_result {
    int status = -1;
    std::string out;   // stdout
    std::string err;   // stderr
};

// Runs a shell command line; stdout and stderr are kept apart.
run_result run(const std::string& cmd) {
    qrt::testing::run_options o;
    o.timeout = std::chrono::minutes(5);
    auto r = qrt::testing::run_shell(cmd, o);
    return {r.exit_code, std::move(r.out), std::move(r.err)};
}

std::string write_temp(const std::string& name, const std::string& text) {
    const auto path = fs::temp_directory_path() / ("qrt-cli-" + std::to_string(::getpid()) + "-" + name);
    std::ofstream(path) << text;
    return path.string();
}

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Every file under root (relative path -> bytes), and every directory.
std::map<std::string, std::string> snapshot_tree(const fs::path& root) {
    std::map<std::string, std::string> snap;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
        const auto rel = fs::relative(e.path(), root).string();
        if (e.is_directory()) {
            snap[rel + "/"] = "";
        } else if (e.is_regular_file()) {
            snap[rel] = read_file(e.path());
        }
    }
    return snap;
}

class temp_dir {
public:
    temp_dir() {
        char tmpl[] = "/tmp/qrt-cli-XXXXXX";
        if (::mkdtemp(tmpl) != nullptr) {
            _path = tmpl;
        }
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(_path, ec);
    }
    const fs::path& path() const { return _path; }
    std::string str() const { return _path.string(); }

private:
    fs::path _path;
};

// A writable copy of a fake tree, plus a state directory and a journal
// directory (created by the first apply) beside it.
struct tree_copy {
    temp_dir dir;
    fs::path root;
    fs::path state;
    fs::path journal;
    explicit tree_copy(const std::string& name) {
        root = dir.path() / "root";
        state = dir.path() / "state";
        journal = dir.path() / "journal";
        fs::copy(trees + "/" + name, root, fs::copy_options::recursive);
        fs::create_directories(state);
    }
    // --root, --state-dir and --journal-dir for this copy.
    std::string dirs() const {
        return " --root " + root.string() + " --state-dir " + state.string() + " --journal-dir " + journal.string();
    }
};

// demo.toml with agent.user set (the runs on fake trees keep root: their
// temporary directories are root's).
std::string demo_text_as(const std::string& user) {
    std::string text = read_file(demo);
    const std::string anchor = "log_level = \"info\"";
    text.replace(text.find(anchor), anchor.size(), anchor + "\nuser = \"" + user + "\"");
    return text;
}
const std::string& demo_as_root() {
    static const std::string path = write_temp("demo-root.toml", demo_text_as("root"));
    return path;
}

// ---- help, version, usage -------------------------------------------------

TEST(qrtd_cli, help_lists_commands_examples_and_exit_codes) {
    const auto r = run(qrtd + " --help");
    EXPECT_EQ(r.status, 0);
    for (const char* s : {"run", "host", "check-config", "config-reference", "EXAMPLES",
                          "EXIT STATUS", "qrtd host plan", "--root", "--state-dir", "--log-level"}) {
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
    }
}

TEST(qrtd_cli, version_prints_the_version) {
    const auto r = run(qrtd + " --version");
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.out.find("0."), std::string::npos) << r.out;
}

TEST(qrtd_cli, usage_errors_exit_2) {
    EXPECT_EQ(run(qrtd).status, 2);
    EXPECT_EQ(run(qrtd + " frobnicate").status, 2);
    EXPECT_EQ(run(qrtd + " host").status, 2);
    EXPECT_EQ(run(qrtd + " --log-level loud check-config").status, 2);
}

// ---- check-config and config-reference ------------------------------------

TEST(qrtd_cli, check_config_accepts_the_shipped_files) {
    for (const std::string f : {QRT_SOURCE_DIR "/config/qrtd.toml", QRT_SOURCE_DIR "/config/demo.toml",
                                QRT_SOURCE_DIR "/config/profiles/low-latency.toml",
                                QRT_SOURCE_DIR "/config/profiles/two-qpus.toml"}) {
        // --root points at a 2-CPU tree, the smallest host the profiles need
        // to make sense on, so the result does not depend on this machine.
        const auto r = run(qrtd + " check-config -c " + f + " --root " + trees + "/host8-v2");
        EXPECT_EQ(r.status, 0) << f << "\n" << r.err;
        EXPECT_NE(r.out.find(": OK ("), std::string::npos) << r.out;
    }
}

TEST(qrtd_cli, check_config_rejects_a_bad_file_with_exit_2_and_every_message) {
    const auto f = write_temp("bad.toml",
                              "[dispatch]\n"
                              "priority = 150\n"
                              "[host]\n"
                              "isolated_cpus = \"0-1\"\n"
                              "[[qpu]]\n"
                              "name = \"q\"\n"
                              "endpoint = \"http://x\"\n");
    const auto r = run(qrtd + " check-config -c " + f + " --root " + trees + "/vm2-v1");
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.err, f + ":2: dispatch.priority = 150 is out of range 1..99\n" + f +
                         ":4: host.isolated_cpus = \"0-1\" covers every online CPU (0-1): at least one "
                         "core must stay for housekeeping\n" +
                         f + ":7: qpu[0].endpoint = \"http://x\" is not a valid endpoint: scheme must "
                             "be unix://, tcp:// or file://\n");
    EXPECT_EQ(r.out, "");
    fs::remove(f);
}

TEST(qrtd_cli, check_config_refuses_a_file_endpoint_that_is_a_regular_file_naming_path_and_type) {
    // file:// must name a character device or a FIFO (under /dev: /dev/shm
    // is the place a test may create both).  A regular file is an error
    // (exit 2); a FIFO passes; a missing path is only a warning (a device
    // may appear later), exit 0.
    const std::string base = "/dev/shm/qrt-cli-endpoint-" + std::to_string(::getpid());
    const std::string regular = base + ".bin";
    const std::string fifo = base + ".fifo";
    { std::ofstream(regular) << ""; }
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const auto with_endpoint = [](const std::string& name, const std::string& path) {
        return write_temp(name, "[[qpu]]\nname = \"q\"\nendpoint = \"file://" + path + "\"\n");
    };
    const auto f_reg = with_endpoint("ep-regular.toml", regular);
    const auto bad = run(qrtd + " check-config -c " + f_reg);
    EXPECT_EQ(bad.status, 2) << bad.out << bad.err;
    EXPECT_NE(bad.err.find("qpu q: endpoint file://" + regular + ": " + regular +
                           " is a regular file; a file:// endpoint must be a character device (the QPU's "
                           "driver) or a FIFO"),
              std::string::npos)
        << bad.err;
    const auto f_fifo = with_endpoint("ep-fifo.toml", fifo);
    const auto good = run(qrtd + " check-config -c " + f_fifo);
    EXPECT_EQ(good.status, 0) << good.err;
    const auto f_missing = with_endpoint("ep-missing.toml", base + ".missing");
    const auto missing = run(qrtd + " check-config -c " + f_missing);
    EXPECT_EQ(missing.status, 0) << missing.err;
    EXPECT_NE(missing.err.find("warning: qpu q: endpoint file://" + base + ".missing: " + base +
                               ".missing does not exist"),
              std::string::npos)
        << missing.err;
    for (const auto& f : {f_reg, f_fifo, f_missing, regular, fifo}) {
        fs::remove(f);
    }
}

TEST(qrtd_cli, check_config_json_gives_errors_with_lines_or_the_effective_config) {
    const auto f = write_temp("bad.json.toml", "[agent]\nlog_level = \"loud\"\n");
    const auto bad = run(qrtd + " check-config --json -c " + f);
    EXPECT_EQ(bad.status, 2);
    const auto jb = nlohmann::json::parse(bad.out);
    EXPECT_FALSE(jb["ok"].get<bool>());
    ASSERT_EQ(jb["errors"].size(), 2u) << bad.out;   // the bad level, and no [[qpu]]
    EXPECT_EQ(jb["errors"][1]["line"], 2);
    EXPECT_EQ(jb["errors"][1]["option"], "agent.log_level");
    fs::remove(f);

    const auto good = run(qrtd + " check-config --json -c " + demo);
    EXPECT_EQ(good.status, 0) << good.err;
    const auto jg = nlohmann::json::parse(good.out);
    EXPECT_TRUE(jg["ok"].get<bool>());
    EXPECT_EQ(jg["config"]["qpu"][0]["name"], "qpu0");
    EXPECT_EQ(jg["config"]["qpu"][0]["period_ns"], 2000000000);
}

TEST(qrtd_cli, check_config_on_a_missing_file_exits_2_naming_it) {
    const auto r = run(qrtd + " check-config -c /nonexistent/qrtd.toml");
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.err, "/nonexistent/qrtd.toml: cannot read: No such file or directory\n");
}

TEST(qrtd_cli, config_reference_is_the_shipped_qrtd_toml) {
    const auto r = run(qrtd + " config-reference");
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.out, read_file(QRT_SOURCE_DIR "/config/qrtd.toml"));
}

// ---- host commands on fake trees ------------------------------------------

TEST(qrtd_cli, host_plan_on_a_fake_tree_prints_json_and_changes_nothing) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const auto r = run(qrtd + " host plan --json -c " + demo + " --root " + t.root.string());
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["plan"]["isolated"], "1");
    EXPECT_EQ(j["plan"]["housekeeping"], "0");
    EXPECT_EQ(j["plan"]["dispatch_cpus"][0], 1);
    EXPECT_FALSE(j["plan"]["reasons"].empty());
    EXPECT_TRUE(j["kernel"]["warnings"].is_array());
    EXPECT_EQ(snapshot_tree(t.root), before);
}

// Runtime isolation at parity with tuned's cpu-partitioning profile: every
// runtime knob with its value before and after, text and JSON.
TEST(qrtd_cli, host_plan_lists_each_runtime_knob_with_its_before_and_after_value) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const auto r = run(qrtd + " host plan --json -c " + demo + " --root " + t.root.string());
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    std::map<std::string, nlohmann::json> by_path;
    for (const auto& k : j["knobs"]["knobs"]) {
        by_path[k["path"].get<std::string>()] = k;
    }
    const std::pair<const char*, std::pair<const char*, const char*>> want[] = {
        {"/sys/devices/virtual/workqueue/cpumask", {"3", "00000001"}},
        {"/sys/devices/virtual/workqueue/writeback/cpumask", {"3", "00000001"}},
        {"/proc/sys/vm/stat_interval", {"1", "10"}},
        {"/proc/sys/kernel/timer_migration", {"1", "0"}},
        {"/proc/sys/kernel/watchdog_cpumask", {"0-1", "0"}},
        {"/proc/sys/kernel/sched_rt_runtime_us", {"950000", "950000"}},
    };
    for (const auto& [path, values] : want) {
        ASSERT_EQ(by_path.count(path), 1U) << path << "\n" << r.out;
        EXPECT_EQ(by_path[path]["before"], values.first) << path;
        EXPECT_EQ(by_path[path]["after"], values.second) << path;
    }
    EXPECT_EQ(by_path["/proc/sys/kernel/sched_rt_runtime_us"]["action"], "reported");
    const auto text = run(qrtd + " host plan -c " + demo + " --root " + t.root.string());
    ASSERT_EQ(text.status, 0) << text.err;
    EXPECT_NE(text.out.find("runtime knobs (host.runtime_knobs; before -> after as apply sets them):\n"
                            "  knob: workqueue cpumask: 3 -> 00000001 (/sys/devices/virtual/workqueue/cpumask)"),
              std::string::npos)
        << text.out;
    EXPECT_EQ(snapshot_tree(t.root), before) << "plan changed the tree";
}

// The dispatch thread must reach its isolated CPU under systemd: on a
// cgroup v2 host the plan says the partition is out of the
// dispatch threads' reach, why, and what apply uses instead.
TEST(qrtd_cli, host_plan_on_a_v2_tree_says_the_fence_is_used_and_why_not_the_partition) {
    tree_copy t("host8-v2");
    const auto before = snapshot_tree(t.root);
    const auto r = run(qrtd + " host plan -c " + demo + " --root " + t.root.string());
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* s :
         {"isolation: not used: cgroup-v2-partition: the dispatch threads could not run in it: a partition takes its "
          "CPUs from every other cgroup",
          "isolation: apply will use affinity-fence",
          "isolation: dispatch threads: each pins itself to its CPU with sched_setaffinity"}) {
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
    }
    EXPECT_EQ(snapshot_tree(t.root), before);
}

TEST(qrtd_cli, host_plan_with_a_synthetic_topology_isolates_whole_cores) {
    tree_copy t("host8-v2");
    const auto r = run(qrtd + " host plan --json -c " + demo + " --root " + t.root.string() +
                       " --topology 'synthetic:package:1 core:4 pu:2'");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["topology"], "synthetic:package:1 core:4 pu:2");
    EXPECT_EQ(j["plan"]["isolated"], "6-7") << r.out;
}

// More QPUs than spare cores: two tuned QPUs on a host with one core to spare.  With
// dispatch.qpus_per_cpu = 2 the plan puts both on the one isolated CPU and
// says why; with the default 1 it is refused, naming the cores.
TEST(qrtd_cli, host_plan_puts_two_tuned_qpus_on_one_cpu_only_with_qpus_per_cpu_2) {
    tree_copy t("host8-v2");
    std::string text = read_file(demo);
    text += "\n[[qpu]]\nname = \"qpu1\"\nendpoint = \"unix:///run/qrtd-demo-qpu/qpu1.sock\"\n";
    const std::string two = write_temp("two-tuned.toml", text);
    const std::string anchor = "mode = \"tuned\"";
    text.replace(text.find(anchor), anchor.size(), anchor + "\nqpus_per_cpu = 2");
    const std::string shared = write_temp("two-tuned-shared.toml", text);
    const std::string topo = " --root " + t.root.string() + " --topology 'synthetic:core:2 pu:1'";
    const auto refused = run(qrtd + " host plan -c " + two + topo);
    EXPECT_NE(refused.status, 0) << refused.out << refused.err;
    EXPECT_NE(refused.err.find("cannot isolate 2 cores"), std::string::npos) << refused.err;
    const auto r = run(qrtd + " host plan --json -c " + shared + topo);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["plan"]["isolated"], "1") << r.out;
    EXPECT_EQ(j["plan"]["dispatch_cpus"], nlohmann::json::array({1})) << r.out;
    EXPECT_NE(r.out.find("2 QPUs share 1 isolated dispatch CPU (1), up to 2 on each (dispatch.qpus_per_cpu = 2"),
              std::string::npos)
        << r.out;
    const auto plain = run(qrtd + " host plan -c " + shared + topo);
    ASSERT_EQ(plain.status, 0) << plain.err;
    EXPECT_NE(plain.out.find("qpu 0+1 dispatch cpu: 1"), std::string::npos) << plain.out;
    fs::remove(two);
    fs::remove(shared);
}

TEST(qrtd_cli, host_apply_dry_run_lists_writes_and_changes_nothing) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const auto r = run(qrtd + " host apply --dry-run -c " + demo + t.dirs());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("write /proc/irq/"), std::string::npos) << r.out;
    EXPECT_EQ(snapshot_tree(t.root), before);
    EXPECT_TRUE(fs::is_empty(t.state));
    EXPECT_FALSE(fs::exists(t.journal)) << "a dry run created the journal directory";
}

TEST(qrtd_cli, host_apply_then_restore_leaves_the_tree_byte_identical) {
    for (const char* name : {"vm2-v1", "host8-v2", "host4-nocg"}) {
        tree_copy t(name);
        const auto before = snapshot_tree(t.root);
        const auto common = " -c " + demo + t.dirs();
        const auto a = run(qrtd + " host apply --json" + common);
        ASSERT_EQ(a.status, 0) << name << "\n" << a.err;
        const auto j = nlohmann::json::parse(a.out);
        EXPECT_NE(snapshot_tree(t.root), before) << name << ": apply changed nothing";
        const auto v = run(qrtd + " host verify" + common);
        EXPECT_EQ(v.status, 0) << name << "\n" << v.out << v.err;
        const auto r = run(qrtd + " host restore" + common);
        ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
        EXPECT_EQ(snapshot_tree(t.root), before) << name << " (isolation "
                                                 << j["apply"]["isolation"]["method"] << ")";
    }
}

TEST(qrtd_cli, host_restore_works_with_a_broken_config) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    ASSERT_EQ(run(qrtd + " host apply -c " + demo + t.dirs()).status, 0);
    const auto broken = write_temp("broken.toml", "this is [not toml\n");
    const auto r = run(qrtd + " host restore -c " + broken + t.dirs());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(snapshot_tree(t.root), before);
    fs::remove(broken);
}

TEST(qrtd_cli, host_restore_names_journals_set_aside_from_earlier_boots) {
    tree_copy t("vm2-v1");
    const auto common = " -c " + demo + t.dirs();
    {
        fs::create_directories(t.journal);
        fs::permissions(t.journal, fs::perms::owner_all, fs::perm_options::replace);
        std::ofstream(t.journal / "host-journal.0b1c2d3e.stale") << "from an earlier boot\n";
    }
    const auto text = run(qrtd + " host restore" + common);
    EXPECT_EQ(text.status, 0) << text.err;
    EXPECT_NE(text.out.find("set aside from an earlier boot"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("host-journal.0b1c2d3e.stale"), std::string::npos) << text.out;
    const auto js = run(qrtd + " host restore --json" + common);
    ASSERT_EQ(js.status, 0) << js.err;
    const auto j = nlohmann::json::parse(js.out);
    ASSERT_EQ(j["stale_journals"].size(), 1u) << js.out;
    EXPECT_EQ(fs::path(j["stale_journals"][0].get<std::string>()).filename(), "host-journal.0b1c2d3e.stale");
    EXPECT_TRUE(fs::exists(t.journal / "host-journal.0b1c2d3e.stale")) << "restore must not delete it";
}

TEST(qrtd_cli, host_verify_without_apply_exits_1) {
    tree_copy t("vm2-v1");
    const auto r = run(qrtd + " host verify -c " + demo + t.dirs());
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("not applied"), std::string::npos) << r.err;
}

// What the agent knows, it says: the drift watch under systemd is
// qrtd-repin.service, one
// `qrtd host verify --repin` per timer tick.  A known IRQ that drifted back
// onto the isolated CPU and an IRQ that appeared after apply are both
// pinned by one run, which exits 0 (the host is as applied again); the new
// IRQ's original value is journaled first, so restore puts the whole tree
// back byte for byte, the new IRQ included.
TEST(qrtd_cli, one_repin_run_pins_a_drifted_and_a_new_irq_and_restore_stays_byte_exact) {
    tree_copy t("vm2-v1");
    const auto common = " -c " + demo + t.dirs();
    const auto nothing = run(qrtd + " host verify --repin" + common);
    EXPECT_EQ(nothing.status, 0) << "no partition applied is not a failure for the timer\n" << nothing.err;
    EXPECT_NE(nothing.err.find("nothing to re-pin"), std::string::npos) << nothing.err;

    const auto original = snapshot_tree(t.root);
    ASSERT_EQ(run(qrtd + " host apply" + common).status, 0);
    const fs::path irq24 = t.root / "proc/irq/24/smp_affinity_list";
    ASSERT_EQ(read_file(irq24), "0") << "apply did not move IRQ 24 off CPU 1";
    std::ofstream(irq24) << "0-1\n";  // drift: back onto the isolated CPU 1
    fs::copy(trees + "/vm2-v1/proc/irq/24", t.root / "proc/irq/77", fs::copy_options::recursive);
    auto expected = original;  // what restore must give back: the new IRQ as it appeared
    for (const auto& [rel, bytes] : snapshot_tree(t.root)) {
        if (rel.rfind("proc/irq/77", 0) == 0) {
            expected[rel] = bytes;
        }
    }

    const auto r = run(qrtd + " host verify --repin" + common);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.err.find("irq: re-pinned: "), std::string::npos) << r.err;
    EXPECT_EQ(read_file(irq24), "0");
    EXPECT_EQ(read_file(t.root / "proc/irq/77/smp_affinity_list"), "0");
    // The next tick finds nothing to do, and plain verify agrees.
    const auto again = run(qrtd + " host verify --repin" + common);
    EXPECT_EQ(again.status, 0) << again.err;
    EXPECT_EQ(again.err.find("re-pinned"), std::string::npos) << again.err;
    EXPECT_EQ(run(qrtd + " host verify" + common).status, 0);

    ASSERT_EQ(run(qrtd + " host restore" + common).status, 0);
    EXPECT_EQ(snapshot_tree(t.root), expected);
}

TEST(qrtd_cli, apply_with_a_journal_dir_whose_parent_is_missing_fails_and_changes_nothing) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const auto missing = (t.dir.path() / "missing" / "journal").string();
    const auto r = run(qrtd + " host apply -c " + demo + " --root " + t.root.string() + " --state-dir " +
                       t.state.string() + " --journal-dir " + missing);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("journal directory " + missing + ": open " + (t.dir.path() / "missing").string() +
                         ": No such file or directory"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(snapshot_tree(t.root), before);
}

TEST(qrtd_cli, a_journal_dir_inside_the_state_dir_is_a_usage_error) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const auto r = run(qrtd + " host apply -c " + demo + " --root " + t.root.string() + " --state-dir " +
                       t.state.string() + " --journal-dir " + (t.state / "journal").string());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("is inside agent.state_dir"), std::string::npos) << r.err;
    EXPECT_EQ(snapshot_tree(t.root), before);
    EXPECT_TRUE(fs::is_empty(t.state));
}

// ---- run on a fake tree, with a fake systemd notify socket ----------------

TEST(qrtd_cli, run_on_a_fake_tree_notifies_systemd_and_restores_on_exit) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const fs::path sock = t.dir.path() / "notify.sock";
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);

    const auto r = run("NOTIFY_SOCKET=" + sock.string() + " " + qrtd + " run --duration-s 1 -c " + demo_as_root() +
                       t.dirs());
    EXPECT_EQ(r.status, 0) << r.err;
    std::vector<std::string> messages;
    char buf[1024];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
        messages.emplace_back(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    bool ready = false;
    bool stopping = false;
    for (const auto& m : messages) {
        ready = ready || m.rfind("READY=1\nSTATUS=running: 1 QPU, isolated CPUs 1", 0) == 0;
        stopping = stopping || m.rfind("STOPPING=1\n", 0) == 0;
    }
    EXPECT_TRUE(ready) << r.err;
    EXPECT_TRUE(stopping) << r.err;
    for (const char* s : {"daemon: qrtd ", "plan: isolated CPUs 1, housekeeping CPUs 0", "irq: ",
                          "isolation: ", "daemon: stopped"}) {
        EXPECT_NE(r.err.find(s), std::string::npos) << s << "\n" << r.err;
    }
    EXPECT_EQ(snapshot_tree(t.root), before) << r.err;
}

// Waits (at most timeout_s) for a datagram starting with prefix.
bool wait_for_datagram(int fd, const std::string& prefix, int timeout_s) {
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < timeout_s; ++i) {
        char buf[1024];
        ssize_t n = 0;
        while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
            if (std::string(buf, static_cast<std::size_t>(n)).rfind(prefix, 0) == 0) {
                return true;
            }
        }
    }
    return false;
}

TEST(qrtd_cli, run_reloads_on_sighup_pings_the_watchdog_and_restores_on_sigterm) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const fs::path cfg = t.dir.path() / "qrtd.toml";
    std::ofstream(cfg) << demo_text_as("root");
    const fs::path sock = t.dir.path() / "notify.sock";
    const fs::path err = t.dir.path() / "stderr.log";
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);

    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::setenv("NOTIFY_SOCKET", sock.c_str(), 1);
        ::setenv("WATCHDOG_USEC", "400000", 1);   // ping every 200 ms
        ::unsetenv("WATCHDOG_PID");
        const int efd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(efd, STDERR_FILENO);
        ::execl(qrtd.c_str(), "qrtd", "run", "--duration-s", "120", "-c", cfg.c_str(), "--root",
                t.root.c_str(), "--state-dir", t.state.c_str(), "--journal-dir", t.journal.c_str(),
                static_cast<char*>(nullptr));
        ::_exit(127);
    }
    // Whatever happens below, do not leave the daemon running.
    struct reaper {
        pid_t pid;
        bool done = false;
        int wait_status() {
            int st = 0;
            ::waitpid(pid, &st, 0);
            done = true;
            return st;
        }
        ~reaper() {
            if (!done) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
            }
        }
    } child{pid};

    ASSERT_TRUE(wait_for_datagram(fd, "READY=1", 60)) << read_file(err);
    EXPECT_TRUE(wait_for_datagram(fd, "WATCHDOG=1", 30)) << read_file(err);
    // Change two options: log_level applies at once, priority at restart.
    std::string text = read_file(cfg);
    text.replace(text.find("log_level = \"info\""), 18, "log_level = \"debug\"");
    text.replace(text.find("priority = 80"), 13, "priority = 70");
    std::ofstream(cfg) << text;
    ASSERT_EQ(::kill(pid, SIGHUP), 0);
    ASSERT_EQ(::kill(pid, SIGTERM), 0);
    EXPECT_TRUE(wait_for_datagram(fd, "STOPPING=1", 30)) << read_file(err);
    const int st = child.wait_status();
    ::close(fd);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    const std::string log = read_file(err);
    for (const char* s : {"signal: SIGHUP from pid", "config: reload: agent.log_level = \"debug\" (was \"info\")",
                          "config: reload: dispatch.priority = 70 (was 80) takes effect at the next start",
                          "signal: SIGTERM from pid", "daemon: stopping (SIGTERM)", "host: restored:"}) {
        EXPECT_NE(log.find(s), std::string::npos) << s << "\n" << log;
    }
    EXPECT_EQ(snapshot_tree(t.root), before) << log;
}

// In a container (RLIMIT_MEMLOCK 8 MiB, no CAP_IPC_LOCK, no CAP_SYS_RESOURCE)
// qrtd exited at start even in untuned mode, "dispatch:
// io_uring_register_buffers (67239936 bytes): Cannot allocate memory: Cannot
// allocate memory", and systemd restarted it until it gave up.  Untuned now
// starts without registered buffers; tuned refuses once with exit status 3
// (which the unit does not restart), naming the limit, the need and the
// remedy; check-config and host plan say the same beforehand.
std::string memlock_config(const fs::path& dir, const std::string& mode) {
    std::string text = demo_text_as("root");
    const std::string sock = "socket_path = \"/run/qrtd-demo/qrtd.sock\"";
    text.replace(text.find(sock), sock.size(), "socket_path = \"" + (dir / "qrtd.sock").string() + "\"");
    const std::string tuned = "mode = \"tuned\"";
    text.replace(text.find(tuned), tuned.size(), "mode = \"" + mode + "\"");
    const auto path = dir / ("qrtd-" + mode + ".toml");
    std::ofstream(path) << text;
    return path.string();
}

// The shell prefix that runs a command as in such a container.
std::string as_in_a_container() {
    // Without CAP_SYS_RESOURCE (as Docker's default set), so root cannot
    // raise the limit either.
    return ::geteuid() == 0 ? "ulimit -l 8192 && exec setpriv --bounding-set -ipc_lock,-sys_resource "
                              "--inh-caps -ipc_lock,-sys_resource "
                            : "ulimit -l 8192 && exec ";
}

std::size_t count_of(const std::string& text, const std::string& part) {
    std::size_t n = 0;
    for (auto pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + 1)) {
        ++n;
    }
    return n;
}

TEST(qrtd_cli, without_locked_memory_untuned_run_starts_and_tuned_refuses_once_naming_the_limit) {
    if (run("command -v setpriv").status != 0) {
        GTEST_SKIP() << "setpriv (util-linux) is needed to drop CAP_IPC_LOCK";
    }
    const std::string limit = "RLIMIT_MEMLOCK = 8 MiB and no CAP_IPC_LOCK, 64.1 MiB needed";
    {
        tree_copy t("vm2-v1");
        const auto before = snapshot_tree(t.root);
        const auto cfg = memlock_config(t.dir.path(), "untuned");
        const auto r = run(as_in_a_container() + qrtd + " run --duration-s 1 -c " + cfg + t.dirs());
        EXPECT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(count_of(r.err, "untuned: frame buffers not registered with io_uring (plain writes): " + limit), 1U)
            << r.err;
        EXPECT_NE(r.err.find("daemon: stopped"), std::string::npos) << r.err;
        EXPECT_EQ(snapshot_tree(t.root), before) << r.err;
        const auto c = run(as_in_a_container() + qrtd + " check-config -c " + cfg);
        EXPECT_EQ(c.status, 0) << c.err;
        EXPECT_NE(c.err.find("warning: dispatch: started as this process is (uid " + std::to_string(::geteuid()) +
                             "), qrtd run would write from unregistered frame buffers (untuned mode): " + limit),
                  std::string::npos)
            << c.err;
    }
    {
        tree_copy t("vm2-v1");
        const auto before = snapshot_tree(t.root);
        const auto cfg = memlock_config(t.dir.path(), "tuned");
        const auto r = run(as_in_a_container() + qrtd + " run --duration-s 1 -c " + cfg + t.dirs());
        EXPECT_EQ(r.status, 3) << r.err;
        EXPECT_EQ(count_of(r.err, "dispatch: tuned mode cannot lock its frame buffers: " + limit), 1U) << r.err;
        for (const char* part : {"Raise the limit", "LimitMEMLOCK=infinity", "or grant CAP_IPC_LOCK", "dispatch.ring_capacity",
                                 "or run dispatch.mode = \"untuned\""}) {
            EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
        }
        EXPECT_EQ(r.err.find("Cannot allocate memory: Cannot allocate memory"), std::string::npos) << r.err;
        EXPECT_EQ(snapshot_tree(t.root), before) << r.err;
        const std::string would = "qrtd run would refuse to start: tuned mode cannot lock its frame buffers: " + limit;
        const auto c = run(as_in_a_container() + qrtd + " check-config -c " + cfg);
        EXPECT_EQ(c.status, 0) << c.err;
        EXPECT_NE(c.err.find(would), std::string::npos) << c.err;
        const auto p = run(as_in_a_container() + qrtd + " host plan -c " + cfg + " --root " + t.root.string());
        EXPECT_EQ(p.status, 0) << p.err;
        EXPECT_NE(p.out.find(would), std::string::npos) << p.out;
    }
}

TEST(qrtd_cli, run_with_a_bad_config_exits_2_and_changes_nothing) {
    tree_copy t("vm2-v1");
    const auto before = snapshot_tree(t.root);
    const auto bad = write_temp("run-bad.toml", "[dispatch]\npriority = 0\n");
    const auto r = run(qrtd + " run --duration-s 1 -c " + bad + t.dirs());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("config: " + bad + ":2: dispatch.priority = 0 is out of range 1..99"),
              std::string::npos) << r.err;
    EXPECT_EQ(snapshot_tree(t.root), before);
    fs::remove(bad);
}

// ---- the real host (root only) --------------------------------------------

// What apply may touch on the real host: every IRQ's affinity, the default
// affinity, and the cpuset hierarchies (directories and cpuset.* values).
std::map<std::string, std::string> snapshot_host() {
    std::map<std::string, std::string> snap;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/irq", ec)) {
        const auto f = e.path() / "smp_affinity_list";
        if (fs::exists(f)) {
            snap[f.string()] = read_file(f);
        }
    }
    snap["/proc/irq/default_smp_affinity"] = read_file("/proc/irq/default_smp_affinity");
    // The runtime knobs (host.runtime_knobs), exact bytes.
    for (const char* f : {"/sys/devices/virtual/workqueue/cpumask", "/proc/sys/vm/stat_interval",
                          "/proc/sys/kernel/timer_migration", "/proc/sys/kernel/watchdog_cpumask",
                          "/proc/sys/kernel/sched_rt_runtime_us"}) {
        if (fs::exists(f)) {
            snap[f] = read_file(f);
        }
    }
    for (const auto& e : fs::directory_iterator("/sys/devices/virtual/workqueue", ec)) {
        const auto f = e.path() / "cpumask";
        if (e.is_directory(ec) && fs::exists(f)) {
            snap[f.string()] = read_file(f);
        }
    }
    // The v1 cpuset and the cgroup2 mount points, from /proc/mounts.
    std::vector<std::string> roots;
    std::istringstream mounts(read_file("/proc/mounts"));
    std::string dev, dir, type, opts;
    while (mounts >> dev >> dir >> type >> opts) {
        std::string rest;
        std::getline(mounts, rest);
        if (type == "cgroup2" || (type == "cgroup" && ("," + opts + ",").find(",cpuset,") != std::string::npos)) {
            roots.push_back(dir);
        }
    }
    for (const auto& root : roots) {
        auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
        for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
            if (it.depth() > 2) {
                it.disable_recursion_pending();
                continue;
            }
            const auto& p = it->path();
            const auto name = p.filename().string();
            if (it->is_directory(ec)) {
                snap[p.string() + "/"] = "";
            } else if ((name.rfind("cpuset.", 0) == 0 && name.find("memory_pressure") == std::string::npos) ||
                       name == "cgroup.subtree_control") {
                snap[p.string()] = read_file(p);
            }
        }
    }
    return snap;
}

// ---- the root boundary, on fake trees as root ----------------------------

std::string crc_line(const std::string& body) {
    // zlib's CRC-32, as the journal uses: what a forger computes.
    std::uint32_t c = 0xFFFFFFFFU;
    for (char ch : body) {
        c ^= static_cast<unsigned char>(ch);
        for (int k = 0; k < 8; ++k) {
            c = (c & 1U) != 0 ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        }
    }
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", c ^ 0xFFFFFFFFU);
    return std::string(buf) + " " + body + "\n";
}

std::string this_boot() {
    std::string id = read_file("/proc/sys/kernel/random/boot_id");
    while (!id.empty() && id.back() == '\n') {
        id.pop_back();
    }
    return id;
}

class root_boundary : public ::testing::Test {
protected:
    void SetUp() override {
        if (::geteuid() != 0) {
            GTEST_SKIP() << "needs root: the boundary is between root and the daemon's user";
        }
        _secret = _t.dir.path() / "root-only-secret";
        std::ofstream(_secret) << "only root may change this\n";
        ::chmod(_secret.c_str(), 0600);
    }
    tree_copy _t{"vm2-v1"};
    fs::path _secret;
};

// The first case: a forged `file` record with a valid checksum in the
// daemon's state directory.  Root never reads a journal there any more.
TEST_F(root_boundary, a_forged_journal_in_the_state_dir_is_never_replayed) {
    const std::string forged = crc_line("journal 1 " + this_boot()) + crc_line("apply 1 0") +
                               crc_line("file " + _secret.string() + " owned%0a");
    std::ofstream(_t.state / "host-journal") << forged;
    const auto r = run(qrtd + " host restore --state-dir " + _t.state.string() + " --journal-dir " +
                       _t.journal.string());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(read_file(_secret), "only root may change this\n");
    EXPECT_NE(r.err.find((_t.state / "host-journal").string() +
                         " is a journal of an older qrtd, in the daemon's state directory: it is never replayed"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(read_file(_t.state / "host-journal"), forged) << "left for the admin to read";
}

// Even inside root's own directory a record must pass the allow-list.
TEST_F(root_boundary, a_forged_record_in_the_journal_dir_is_refused_naming_the_journal_and_the_path) {
    fs::create_directories(_t.journal);
    fs::permissions(_t.journal, fs::perms::owner_all, fs::perm_options::replace);
    const std::string irq = "/proc/irq/default_smp_affinity";
    std::ofstream(_t.journal / "host-journal")
        << crc_line("journal 2 " + this_boot() + " /") + crc_line("apply 1 0 run") +
               crc_line("file " + _secret.string() + " owned%0a");
    ::chmod((_t.journal / "host-journal").c_str(), 0600);
    const auto host_before = read_file(irq);
    const auto r = run(qrtd + " host restore --state-dir " + _t.state.string() + " --journal-dir " +
                       _t.journal.string());
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find((_t.journal / "host-journal").string() + " line 3: record `file " + _secret.string()),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("is not on the restore allow-list"), std::string::npos) << r.err;
    EXPECT_EQ(read_file(_secret), "only root may change this\n");
    EXPECT_EQ(read_file(irq), host_before);
    EXPECT_TRUE(fs::exists(_t.journal / "host-journal"));
}

// The symlink cases: links planted in the state directory where
// root used to write (the journal, the lock) and where it writes now (the
// partition summary, replaced, never written through).
TEST_F(root_boundary, symlinks_planted_in_the_state_dir_are_never_written_through) {
    const fs::path t1 = _t.dir.path() / "target-journal";
    const fs::path t2 = _t.dir.path() / "target-summary";
    const fs::path t3 = _t.dir.path() / "target-lock";
    for (const auto& p : {t1, t2, t3}) {
        std::ofstream(p) << "untouched\n";
        ::chmod(p.c_str(), 0600);
    }
    fs::create_symlink(t1, _t.state / "host-journal");
    fs::create_symlink(t2, _t.state / "host-partition.json");
    const auto before = snapshot_tree(_t.root);
    const auto a = run(qrtd + " host apply -c " + demo + _t.dirs());
    EXPECT_EQ(a.status, 0) << a.err;
    EXPECT_EQ(read_file(t1), "untouched\n") << "root wrote through a symlinked journal";
    EXPECT_EQ(read_file(t2), "untouched\n") << "root wrote through a symlinked summary";
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(_t.state / "host-partition.json")));
    EXPECT_TRUE(fs::is_regular_file(_t.journal / "host-journal"));

    fs::create_symlink(t3, _t.state / "qrtd.lock");
    const auto r = run(qrtd + " run --duration-s 1 -c " + demo_as_root() + _t.dirs());
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find((_t.state / "qrtd.lock").string() + " is a symlink; refused"), std::string::npos) << r.err;
    EXPECT_EQ(read_file(t3), "untouched\n");

    const auto back = run(qrtd + " host restore" + _t.dirs());
    EXPECT_EQ(back.status, 0) << back.err;
    EXPECT_EQ(snapshot_tree(_t.root), before);
    EXPECT_FALSE(fs::exists(fs::symlink_status(_t.state / "host-partition.json"))) << "restore removes the summary";
}

TEST_F(root_boundary, a_journal_dir_of_another_user_or_writable_by_others_is_refused_and_nothing_changes) {
    const auto before = snapshot_tree(_t.root);
    fs::create_directories(_t.journal);
    ::chmod(_t.journal.c_str(), 0700);
    ASSERT_EQ(::chown(_t.journal.c_str(), 4242, 4242), 0);
    const auto a = run(qrtd + " host apply -c " + demo + _t.dirs());
    EXPECT_EQ(a.status, 1);
    EXPECT_NE(a.err.find("journal directory " + _t.journal.string() + " is owned by uid 4242 with mode 0700"),
              std::string::npos)
        << a.err;
    EXPECT_NE(a.err.find("fix: chown 0:0 " + _t.journal.string()), std::string::npos) << a.err;
    ASSERT_EQ(::chown(_t.journal.c_str(), 0, 0), 0);
    ::chmod(_t.journal.c_str(), 0777);
    const auto b = run(qrtd + " host apply -c " + demo + _t.dirs());
    EXPECT_EQ(b.status, 1);
    EXPECT_NE(b.err.find("has mode 0777"), std::string::npos) << b.err;
    EXPECT_EQ(snapshot_tree(_t.root), before);
    EXPECT_TRUE(fs::is_empty(_t.journal));
}

TEST_F(root_boundary, run_as_root_for_a_missing_user_says_how_to_create_it_and_changes_nothing) {
    const auto before = snapshot_tree(_t.root);
    const auto cfg = write_temp("no-user.toml", demo_text_as("qrt-no-such-user"));
    const auto r = run(qrtd + " run --duration-s 1 -c " + cfg + _t.dirs());
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("agent.user = \"qrt-no-such-user\""), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("user \"qrt-no-such-user\" does not exist"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("systemd-sysusers"), std::string::npos) << r.err;
    EXPECT_EQ(snapshot_tree(_t.root), before);
    EXPECT_FALSE(fs::exists(_t.journal));
    fs::remove(cfg);
}

// ---- the real host (root only) --------------------------------------------

// The daemon's user and group as the package makes them: systemd-sysusers
// with the shipped sysusers.d file.  What this created is removed again.
class deployed_user {
public:
    deployed_user() {
        _had_user = run("getent passwd qrtd").status == 0;
        _had_group = run("getent group qrt").status == 0;
        const auto r = run("systemd-sysusers " QRT_SOURCE_DIR "/systemd/sysusers.d/qrtd.conf");
        if (r.status != 0) {
            _why = "systemd-sysusers failed: " + r.err;
            return;
        }
        auto pw = run("getent passwd qrtd");
        auto gr = run("getent group qrt");
        if (pw.status != 0 || gr.status != 0) {
            _why = "systemd-sysusers did not create qrtd/qrt";
            return;
        }
        _uid = static_cast<uid_t>(std::stoul(pw.out.substr(pw.out.find(':', pw.out.find(':') + 1) + 1)));
        _gid = static_cast<gid_t>(std::stoul(gr.out.substr(gr.out.find(':', gr.out.find(':') + 1) + 1)));
    }
    ~deployed_user() {
        if (!_had_user) {
            (void)run("userdel qrtd");
        }
        if (!_had_group) {
            (void)run("groupdel qrt");
        }
    }
    deployed_user(const deployed_user&) = delete;
    deployed_user& operator=(const deployed_user&) = delete;
    const std::string& why_not() const { return _why; }
    // Why user qrtd cannot execute binary (a build tree under a 0700
    // directory, as a fresh clone in a mktemp -d is), or "" when it can.
    std::string cannot_run(const std::string& binary) const {
        const auto r = run("setpriv --reuid=qrtd --regid=qrt --init-groups test -x " + binary);
        return r.status == 0 ? "" : "user qrtd cannot execute " + binary + " (a parent directory is not searchable by it)";
    }
    uid_t uid() const { return _uid; }
    gid_t gid() const { return _gid; }

private:
    bool _had_user = false;
    bool _had_group = false;
    std::string _why;
    uid_t _uid = 0;
    gid_t _gid = 0;
};

// A process started in the background, its stderr and stdout in a log file;
// killed and reaped by the destructor if the test did not.
class background {
public:
    background(const std::vector<std::string>& argv, const fs::path& log) : _log(log) {
        _pid = ::fork();
        if (_pid == 0) {
            const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            ::dup2(fd, STDERR_FILENO);
            ::dup2(fd, STDOUT_FILENO);
            std::vector<char*> args;
            for (const auto& a : argv) {
                args.push_back(const_cast<char*>(a.c_str()));
            }
            args.push_back(nullptr);
            ::execv(args[0], args.data());
            ::_exit(127);
        }
    }
    ~background() {
        if (_pid > 0) {
            ::kill(_pid, SIGKILL);
            ::waitpid(_pid, nullptr, 0);
        }
    }
    background(const background&) = delete;
    background& operator=(const background&) = delete;
    pid_t pid() const { return _pid; }
    std::string log() const { return read_file(_log); }
    // Waits (at most timeout_s) until the log holds needle or the process exits.
    bool wait_log(const std::string& needle, int timeout_s) const {
        for (int i = 0; i < timeout_s * 20; ++i) {
            if (log().find(needle) != std::string::npos) {
                return true;
            }
            if (::waitpid(_pid, nullptr, WNOHANG) == _pid) {
                return false;
            }
            ::usleep(50000);
        }
        return false;
    }
    // Sends sig and reaps; the wait status.
    int stop(int sig) {
        ::kill(_pid, sig);
        int st = 0;
        ::waitpid(_pid, &st, 0);
        _pid = -1;
        return st;
    }

private:
    pid_t _pid = -1;
    fs::path _log;
};

// "Key:\tvalue" of /proc/<pid>/status.
std::string status_field(pid_t pid, const std::string& key) {
    std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(key + ":", 0) == 0) {
            auto v = line.substr(key.size() + 1);
            while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) {
                v.erase(0, 1);
            }
            return v;
        }
    }
    return "";
}

// The children of pid named comm.
std::vector<pid_t> children_named(pid_t pid, const std::string& comm) {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
        const auto name = e.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) {
            continue;
        }
        if (status_field(static_cast<pid_t>(std::stol(name)), "PPid") == std::to_string(pid) &&
            status_field(static_cast<pid_t>(std::stol(name)), "Name") == comm) {
            out.push_back(static_cast<pid_t>(std::stol(name)));
        }
    }
    return out;
}

void expect_same_host(const std::map<std::string, std::string>& before, const std::string& when) {
    const auto after = snapshot_host();
    for (const auto& [path, value] : before) {
        auto it = after.find(path);
        if (it == after.end()) {
            ADD_FAILURE() << when << ": " << path << " is gone";
        } else {
            EXPECT_EQ(it->second, value) << when << ": " << path;
        }
    }
    for (const auto& [path, value] : after) {
        EXPECT_TRUE(before.count(path)) << when << ": " << path << " was left behind";
    }
}

class real_host : public ::testing::Test {
protected:
    void SetUp() override {
        if (::geteuid() != 0) {
            GTEST_SKIP() << "needs root to change IRQ affinity and cpusets";
        }
        if (read_file("/sys/devices/system/cpu/online") == "0\n") {
            GTEST_SKIP() << "a single CPU cannot be partitioned";
        }
        for (const char* d : {"/sys/fs/cgroup/cpuset/qrt-isolated", "/sys/fs/cgroup/cpuset/qrt-housekeeping",
                              "/sys/fs/cgroup/unified/qrt-isolated", "/sys/fs/cgroup/unified/qrt-housekeeping",
                              "/sys/fs/cgroup/qrt-isolated", "/sys/fs/cgroup/qrt-housekeeping",
                              "/var/lib/qrtd-host/host-journal"}) {
            if (fs::exists(d)) {
                GTEST_SKIP() << d << " exists: the host is already partitioned by another qrtd; "
                             << "comparing against that state would prove nothing";
            }
        }
        _base.emplace();
        // The daemon's user must reach its state and socket below here.
        ::chmod(_base->path().c_str(), 0755);
        _armed = true;
    }
    void TearDown() override {
        // Whatever happened, leave the host as it was (waiting for a restore
        // helper that is still at work).
        if (_armed && fs::exists(journal() / "host-journal")) {
            (void)run(qrtd + " host restore" + dirs());
        }
    }
    fs::path state() const { return _base->path() / "state"; }
    fs::path journal() const { return _base->path() / "journal"; }
    fs::path socket() const { return _base->path() / "run" / "qrtd.sock"; }
    std::string dirs() const { return " --state-dir " + state().string() + " --journal-dir " + journal().string(); }
    // demo.toml for agent.user, with the socket below the test's directory.
    std::string config(const std::string& user) const {
        std::string text = demo_text_as(user);
        const std::string from = "socket_path = \"/run/qrtd-demo/qrtd.sock\"";
        text.replace(text.find(from), from.size(), "socket_path = \"" + socket().string() + "\"");
        const auto p = _base->path() / ("qrtd-" + user + ".toml");
        std::ofstream(p) << text;
        return p.string();
    }
    std::vector<std::string> run_argv(const std::string& cfg, int duration_s) const {
        return {qrtd, "run", "--duration-s", std::to_string(duration_s), "-c", cfg, "--state-dir", state().string(),
                "--journal-dir", journal().string()};
    }

    std::optional<temp_dir> _base;
    bool _armed = false;
};

TEST_F(real_host, run_applies_the_partition_and_restores_the_host_byte_for_byte) {
    const auto before = snapshot_host();
    const auto r = run(qrtd + " run --duration-s 2 -c " + config("root") + dirs());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("irq: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("host: restored:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("caps: kept"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(journal() / "host-journal")) << "journal left behind";
    expect_same_host(before, "after the run");
}

// The root boundary: "qrtd run as root fails on any host where group qrt exists" (it
// dropped CAP_CHOWN before chowning its socket), and "run by hand, the
// daemon keeps uid 0".  Run the deployed way: user qrtd from the shipped
// sysusers.d file.
// Whether this process could make RLIMIT_MEMLOCK unlimited (as `qrtd run`
// started by it tries): the limit already is, the hard one is, or it holds
// CAP_SYS_RESOURCE (capget: bit 24 of the effective set).
bool raise_memlock_would_work() {
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_max == RLIM_INFINITY) {
        return true;
    }
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("CapEff:", 0) == 0) {
            return (std::stoull(line.substr(7), nullptr, 16) >> CAP_SYS_RESOURCE & 1U) != 0;
        }
    }
    return false;
}

TEST_F(real_host, run_as_root_binds_a_qrt_socket_then_runs_as_qrtd_with_only_the_capabilities_it_needs) {
    deployed_user user;
    if (!user.why_not().empty()) {
        GTEST_SKIP() << user.why_not();
    }
    const auto before = snapshot_host();
    background d(run_argv(config("qrtd"), 60), _base->path() / "run.log");
    ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
    // The daemon: uid and gid qrtd/qrt, exactly the three capabilities, and
    // RLIMIT_MEMLOCK unlimited in place of CAP_IPC_LOCK.
    const std::string uid = std::to_string(user.uid());
    const std::string gid = std::to_string(user.gid());
    EXPECT_EQ(status_field(d.pid(), "Uid"), uid + "\t" + uid + "\t" + uid + "\t" + uid);
    EXPECT_EQ(status_field(d.pid(), "Gid"), gid + "\t" + gid + "\t" + gid + "\t" + gid);
    // CAP_SYS_NICE 23, CAP_PERFMON 38, CAP_BPF 39, and RLIMIT_MEMLOCK
    // raised to unlimited as root, in place of CAP_IPC_LOCK 14.  Where root
    // cannot raise it (no CAP_SYS_RESOURCE: a container, or this VM), the
    // daemon keeps CAP_IPC_LOCK instead and says why.
    const bool can_raise = raise_memlock_would_work();
    const std::string kept = can_raise ? "000000c000800000" : "000000c000804000";
    EXPECT_EQ(status_field(d.pid(), "CapEff"), kept);
    EXPECT_EQ(status_field(d.pid(), "CapPrm"), kept);
    EXPECT_EQ(status_field(d.pid(), "CapBnd"), kept) << "bounding set not reduced";
    {
        std::ifstream in("/proc/" + std::to_string(d.pid()) + "/limits");
        std::string line, memlock;
        while (std::getline(in, line)) {
            if (line.rfind("Max locked memory", 0) == 0) {
                memlock = line;
            }
        }
        EXPECT_EQ(memlock.find("unlimited") != std::string::npos, can_raise) << memlock;
    }
    EXPECT_EQ(status_field(d.pid(), "CapInh"), "0000000000000000");
    EXPECT_EQ(status_field(d.pid(), "CapAmb"), "0000000000000000");
    EXPECT_EQ(status_field(d.pid(), "NoNewPrivs"), "1");
    // The socket: group qrt, mode 0660, bound and chown'ed before the drop.
    struct stat st {};
    ASSERT_EQ(::stat(socket().c_str(), &st), 0) << d.log();
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_gid, user.gid());
    EXPECT_EQ(st.st_mode & 0777U, 0660U);
    // The state directory is the daemon's; the journal directory root's.
    ASSERT_EQ(::stat(state().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, user.uid());
    ASSERT_EQ(::stat(journal().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 0U);
    EXPECT_EQ(st.st_mode & 0777U, 0700U);
    // The restore helper stays root.
    const auto helpers = children_named(d.pid(), "qrtd-restore");
    ASSERT_EQ(helpers.size(), 1U) << d.log();
    EXPECT_EQ(status_field(helpers[0], "Uid"), "0\t0\t0\t0");
    const int st_exit = d.stop(SIGTERM);
    EXPECT_TRUE(WIFEXITED(st_exit) && WEXITSTATUS(st_exit) == 0) << d.log();
    const std::string log = d.log();
    if (can_raise) {
        EXPECT_NE(log.find("caps: kept CAP_SYS_NICE,CAP_PERFMON,CAP_BPF;"), std::string::npos) << log;
    } else {
        EXPECT_NE(log.find("CAP_IPC_LOCK is kept, if permitted, for the locked dispatch paths"), std::string::npos)
            << log;
        EXPECT_NE(log.find("caps: kept CAP_IPC_LOCK,CAP_SYS_NICE,CAP_PERFMON,CAP_BPF;"), std::string::npos) << log;
    }
    EXPECT_NE(log.find("running as uid " + uid + " (qrtd)"), std::string::npos) << log;
    EXPECT_NE(log.find("host: restored:"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(journal() / "host-journal"));
    expect_same_host(before, "after SIGTERM");
}

// The root boundary: a restart (or `qrtd host restore`) right after a kill -9 of `qrtd
// run` collided with the restore helper; now it waits for it, and the host
// ends byte for byte as it was, under load, every time.
TEST_F(real_host, a_restart_racing_the_restore_helper_after_kill_9_leaves_the_host_byte_for_byte) {
    deployed_user user;
    if (!user.why_not().empty()) {
        GTEST_SKIP() << user.why_not();
    }
    const auto before = snapshot_host();
    const std::string cfg = config("qrtd");
    // Load: tasks forking and exiting all the time, so cgroups have tasks
    // coming and going while they are removed.  Bounded; killed by pid.
    std::vector<std::unique_ptr<background>> load;
    for (int i = 0; i < 2; ++i) {
        load.push_back(std::make_unique<background>(
            std::vector<std::string>{"/bin/sh", "-c",
                                     "end=$(( $(date +%s) + 100 )); while [ $(date +%s) -lt $end ]; do "
                                     "/bin/true; done"},
            _base->path() / ("load-" + std::to_string(i) + ".log")));
    }
    for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        background d(run_argv(cfg, 60), _base->path() / ("killed-" + std::to_string(round) + ".log"));
        ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
        const int st = d.stop(SIGKILL);
        ASSERT_TRUE(WIFSIGNALED(st));
        if (round % 2 == 0) {
            // A new daemon at once: it waits for the helper, then applies.
            const auto again = run(qrtd + " run --duration-s 1 -c " + cfg + dirs());
            EXPECT_EQ(again.status, 0) << again.err;
            EXPECT_NE(again.err.find("host: restored:"), std::string::npos) << again.err;
        } else {
            // `qrtd host restore` at once: waits, then says who restored.
            const auto r = run(qrtd + " host restore" + dirs());
            EXPECT_EQ(r.status, 0) << r.err;
            EXPECT_NE((r.out + r.err).find("qrtd-restore (pid"), std::string::npos)
                << "does not say who restored:\n" << r.out << r.err;
        }
        EXPECT_FALSE(fs::exists(journal() / "host-journal"));
        expect_same_host(before, "round " + std::to_string(round));
    }
}

// Drift made by hand: every IRQ affinity that differs from `before` (what
// apply moved) is written back to its value there.  The paths where the
// kernel took it.
std::vector<std::string> write_irqs_back(const std::map<std::string, std::string>& before) {
    std::vector<std::string> moved;
    for (const auto& [path, value] : before) {
        if (path.rfind("/proc/irq/", 0) == 0 && path != "/proc/irq/default_smp_affinity" &&
            read_file(path) != value) {
            std::ofstream f(path);
            f << value;
            f.close();
            if (read_file(path) == value) {
                moved.push_back(path);
            }
        }
    }
    return moved;
}

// The root boundary: later daemons trusted a journal whose partition had drifted (IRQs back
// on every CPU) and said "already applied".  Now qrtd run checks it against
// the host and re-pins, even when `qrtd host apply` owns it.
TEST_F(real_host, run_over_a_drifted_journal_re_pins_instead_of_saying_already_applied) {
    const auto before = snapshot_host();
    const std::string cfg = config("root");
    const auto a = run(qrtd + " host apply -c " + cfg + dirs());
    ASSERT_EQ(a.status, 0) << a.err;
    // Drift: every IRQ apply moved goes back to its old value.
    const std::vector<std::string> moved = write_irqs_back(before);
    ASSERT_FALSE(moved.empty()) << "no IRQ could be moved back";
    const auto r = run(qrtd + " run --duration-s 1 -c " + cfg + dirs());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("host: drift: "), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("already applied (journal"), std::string::npos) << r.err;
    for (const auto& p : moved) {
        EXPECT_NE(read_file(p), before.at(p)) << p << " was left on the isolated CPUs";
    }
    const auto back = run(qrtd + " host restore" + dirs());
    EXPECT_EQ(back.status, 0) << back.err;
    expect_same_host(before, "after restore");
}

// What the agent knows, it says: under systemd the IRQ drift watch is
// qrtd-repin.service
// (`qrtd host verify --repin` as root, every 30 s).  An IRQ whose affinity
// is written back onto the isolated CPU after apply is re-pinned by one run,
// which exits 0 and logs it; restore still puts every value back byte for
// byte.  Run under `flock /tmp/qrt-host.lock` on a shared machine.
TEST_F(real_host, one_run_of_the_repin_helper_re_pins_a_drifted_irq_and_restore_is_byte_exact) {
    const auto before = snapshot_host();
    const std::string cfg = config("root");
    const auto a = run(qrtd + " host apply -c " + cfg + dirs());
    ASSERT_EQ(a.status, 0) << a.err;
    const std::vector<std::string> moved = write_irqs_back(before);
    if (moved.empty()) {
        (void)run(qrtd + " host restore" + dirs());
        GTEST_SKIP() << "no IRQ whose affinity can be written back onto the isolated CPU here";
    }
    const auto r = run(qrtd + " host verify --repin -c " + cfg + dirs());
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.err.find("irq: re-pinned: "), std::string::npos) << r.err;
    for (const auto& p : moved) {
        EXPECT_NE(read_file(p), before.at(p)) << p << " was left on the isolated CPU";
    }
    const auto again = run(qrtd + " host verify -c " + cfg + dirs());
    EXPECT_EQ(again.status, 0) << "drift left after one re-pin run:\n" << again.out << again.err;
    const auto back = run(qrtd + " host restore" + dirs());
    EXPECT_EQ(back.status, 0) << back.err;
    expect_same_host(before, "after restore");
}

}  // namespace

// ---- the dispatch thread on its isolated CPU, for real (cgroup v1) ----

namespace {

// Fields of /proc/<pid>/task/<tid>/stat after the comm: field N is [N - 3].
std::vector<std::string> thread_stat(pid_t pid, pid_t tid) {
    const std::string s = read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
    std::vector<std::string> f;
    const auto close = s.rfind(')');
    if (close == std::string::npos) {
        return f;
    }
    std::istringstream in(s.substr(close + 1));
    std::string w;
    while (in >> w) {
        f.push_back(w);
    }
    return f;
}

std::string thread_status_field(pid_t pid, pid_t tid, const std::string& key) {
    std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(key + ":", 0) == 0) {
            auto v = line.substr(key.size() + 1);
            while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) {
                v.erase(0, 1);
            }
            return v;
        }
    }
    return "";
}

// The cpuset line of /proc/<pid>/task/<tid>/cgroup ("3:cpuset:/qrt-isolated").
std::string thread_cpuset(pid_t pid, pid_t tid) {
    std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/cgroup"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.find(":cpuset:") != std::string::npos) {
            return line.substr(line.find(":cpuset:") + 8);
        }
    }
    return "";
}

// "dispatch thread tid N is SCHED_FIFO on CPU C" from the daemon's log.
std::pair<pid_t, int> dispatch_thread_of(const std::string& log) {
    const std::string key = "dispatch thread tid ";
    const auto p = log.find(key);
    if (p == std::string::npos) {
        return {0, -1};
    }
    const pid_t tid = static_cast<pid_t>(std::stol(log.substr(p + key.size())));
    const auto c = log.find("SCHED_FIFO on CPU ", p);
    return {tid, c == std::string::npos ? -1 : std::stoi(log.substr(c + 18))};
}

// What the user of the deployed unit relies on: the dispatch thread runs
// SCHED_FIFO 80 on its isolated CPU, allowed there only, inside the isolated
// cpuset, while the daemon's other threads stay on housekeeping.
void expect_dispatch_thread_on_isolated_cpu(pid_t pid, const std::string& log) {
    const auto [tid, cpu] = dispatch_thread_of(log);
    ASSERT_GT(tid, 0) << "no \"dispatch thread tid\" line:\n" << log;
    ASSERT_GE(cpu, 0) << log;
    const auto st = thread_stat(pid, tid);
    ASSERT_GE(st.size(), 39U) << "no /proc stat for tid " << tid;
    EXPECT_EQ(st[38], "1") << "policy (field 41) is not SCHED_FIFO";
    EXPECT_EQ(st[37], "80") << "rt_priority (field 40)";
    EXPECT_EQ(st[36], std::to_string(cpu)) << "last CPU (field 39)";
    EXPECT_EQ(thread_status_field(pid, tid, "Cpus_allowed_list"), std::to_string(cpu));
    EXPECT_EQ(thread_cpuset(pid, tid), "/qrt-isolated");
    EXPECT_EQ(thread_cpuset(pid, pid), "/qrt-housekeeping") << "the main thread must stay on housekeeping";
    EXPECT_EQ(thread_status_field(pid, pid, "Cpus_allowed_list").find(std::to_string(cpu)), std::string::npos)
        << "the main thread may run on the isolated CPU";
}

}  // namespace

class dispatch_placement : public real_host {
protected:
    void SetUp() override {
        real_host::SetUp();
        if (IsSkipped()) {
            return;
        }
        if (!fs::exists("/sys/fs/cgroup/cpuset/cpuset.cpus")) {
            GTEST_SKIP() << "no cgroup v1 cpuset at /sys/fs/cgroup/cpuset (cgroup v2 is tested on the vmhost guest)";
        }
        // User qrtd and group qrt as the package makes them, able to run the
        // build's qrtd; then the host as it was before the test.
        _user.emplace();
        if (!_user->why_not().empty()) {
            GTEST_SKIP() << _user->why_not();
        }
        if (const auto why = _user->cannot_run(qrtd); !why.empty()) {
            GTEST_SKIP() << why;
        }
        _before = snapshot_host();
    }
    void TearDown() override {
        _user.reset();  // before the host is put back, as at the end of a test
        real_host::TearDown();
    }
    const deployed_user& user() const { return *_user; }
    // `qrtd host apply` with cfg, which must succeed.
    void apply(const std::string& cfg) const {
        const auto a = run(qrtd + " host apply -c " + cfg + dirs());
        ASSERT_EQ(a.status, 0) << a.err << a.out;
    }
    // `qrtd host restore`, then the host must be as it was before the test.
    void restore_and_expect_the_host_as_before() const {
        const auto r = run(qrtd + " host restore" + dirs());
        EXPECT_EQ(r.status, 0) << r.err << r.out;
        expect_same_host(_before, "after host restore");
    }
    // SIGTERM, and the daemon must exit 0.
    static void stop_cleanly(background& d) {
        const int rc = d.stop(SIGTERM);
        EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << d.log();
    }
    // The daemon exits by itself, refusing with exit status 3; its log.
    static std::string refused_with_3(background& d) {
        const int rc = d.stop(0);  // waits for it to exit by itself
        const std::string log = d.log();
        EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 3) << log;
        return log;
    }
    // config(user) with lines added to [dispatch].
    std::string config_with(const std::string& user, const std::string& dispatch_lines) const {
        std::string text = read_file(config(user));
        const std::string anchor = "mode = \"tuned\"";
        text.replace(text.find(anchor), anchor.size(), anchor + "\n" + dispatch_lines);
        const auto p = _base->path() / ("qrtd-" + user + "-dispatch.toml");
        std::ofstream(p) << text;
        return p.string();
    }
    // The unit's way onto a fence host, forced on v1: the directories handed
    // to user qrtd, a config with host.isolation = "fence", and `qrtd host
    // apply` with it as root.  cfg: that config.
    void apply_fence_as_unit_would(std::string& cfg) const {
        hand_dirs_to(user());
        cfg = config_with("qrtd", "cpu_dma_latency = false");
        std::string text = read_file(cfg);
        const std::string from = "isolation = \"auto\"";
        ASSERT_NE(text.find(from), std::string::npos);
        text.replace(text.find(from), from.size(), "isolation = \"fence\"");
        std::ofstream(cfg) << text;
        ASSERT_NO_FATAL_FAILURE(apply(cfg));
    }
    // The state and socket directories for a daemon started as user qrtd.
    void hand_dirs_to(const deployed_user& u) const {
        fs::create_directories(state());
        fs::create_directories(socket().parent_path());
        ASSERT_EQ(::chown(state().c_str(), u.uid(), u.gid()), 0);
        ASSERT_EQ(::chown(socket().parent_path().c_str(), u.uid(), u.gid()), 0);
    }
    // `qrtd run` as user qrtd, as the unit starts it (User=, Group=,
    // AmbientCapabilities=, CapabilityBoundingSet=, INVOCATION_ID), with the
    // given capabilities and prefix commands (prlimit).
    std::vector<std::string> as_unit(const std::string& cfg, const std::string& caps,
                                     const std::vector<std::string>& prefix = {}) const {
        std::vector<std::string> argv{"/usr/bin/setpriv", "--reuid=qrtd", "--regid=qrt", "--init-groups",
                                      "--inh-caps=" + caps, "--ambient-caps=" + caps,
                                      "--bounding-set=-all," + caps, "--"};
        argv.insert(argv.end(), prefix.begin(), prefix.end());
        argv.insert(argv.end(), {"/usr/bin/env", "INVOCATION_ID=qrt-test"});
        for (const auto& a : run_argv(cfg, 60)) {
            argv.push_back(a);
        }
        return argv;
    }

    std::optional<deployed_user> _user;
    std::map<std::string, std::string> _before;
};

TEST_F(dispatch_placement, run_as_root_puts_the_dispatch_thread_sched_fifo_on_its_isolated_cpu_in_the_isolated_cpuset) {
    // cpu_dma_latency = false: /dev/cpu_dma_latency is root's here (the
    // package's tmpfiles.d gives group qrt access).
    const auto cfg = config_with("qrtd", "require_rt = \"always\"\ncpu_dma_latency = false");
    background d(run_argv(cfg, 60), _base->path() / "run.log");
    ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
    const std::string log = d.log();
    expect_dispatch_thread_on_isolated_cpu(d.pid(), log);
    EXPECT_NE(log.find("isolation: handed /sys/fs/cgroup/cpuset/qrt-isolated/tasks to qrtd (uid " +
                       std::to_string(user().uid())),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("dispatch threads: each writes its TID into /sys/fs/cgroup/cpuset/qrt-isolated/tasks"),
              std::string::npos)
        << log;
    struct stat st {};
    ASSERT_EQ(::stat("/sys/fs/cgroup/cpuset/qrt-isolated/tasks", &st), 0);
    EXPECT_EQ(st.st_uid, user().uid());
    ASSERT_EQ(::stat("/sys/fs/cgroup/cpuset/qrt-isolated/cpuset.cpus", &st), 0);
    EXPECT_EQ(st.st_uid, 0U) << "only the tasks file is handed over";
    stop_cleanly(d);
    expect_same_host(_before, "after SIGTERM");
}

// The kernel refuses an SQPOLL poller on a CPU outside its creator's cpuset
// (EINVAL), and a v1 partition keeps the housekeeping thread out of the
// isolated one: before, submit_mode = "sqpoll" fell back to syscall
// submission on every partitioned v1 host.  The dispatch thread now creates
// the ring itself once it joined the isolated cpuset.
TEST_F(dispatch_placement, with_a_v1_partition_sqpoll_submission_gets_its_poller_on_the_isolated_cpu) {
    const auto before = snapshot_host();
    const auto cfg = config_with("root", "require_rt = \"always\"\nsubmit_mode = \"sqpoll\"");
    background d(run_argv(cfg, 60), _base->path() / "run.log");
    ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
    const std::string log = d.log();
    expect_dispatch_thread_on_isolated_cpu(d.pid(), log);
    EXPECT_NE(log.find("submit sqpoll (poller tid"), std::string::npos) << log;
    EXPECT_EQ(log.find("using syscall submission"), std::string::npos) << log;
    const int rc = d.stop(SIGTERM);
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << d.log();
    expect_same_host(before, "after SIGTERM");
}

TEST_F(dispatch_placement, host_apply_then_run_as_qrtd_like_the_unit_reaches_the_isolated_cpu) {
    hand_dirs_to(user());
    // dispatch.require_rt stays "auto": INVOCATION_ID makes it "always".
    const auto cfg = config_with("qrtd", "cpu_dma_latency = false");
    const auto a = run(qrtd + " host apply -c " + cfg + dirs());
    ASSERT_EQ(a.status, 0) << a.err;
    EXPECT_NE(a.out.find("isolation: handed /sys/fs/cgroup/cpuset/qrt-isolated/tasks to qrtd"), std::string::npos)
        << a.out;
    {
        background d(as_unit(cfg, "+sys_nice,+ipc_lock,+bpf,+perfmon"), _base->path() / "unit.log");
        ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
        const std::string log = d.log();
        EXPECT_NE(log.find("dispatch.require_rt = \"auto\": started by systemd (INVOCATION_ID is set)"),
                  std::string::npos)
            << log;
        EXPECT_EQ(status_field(d.pid(), "CapEff"), "000000c000804000");
        expect_dispatch_thread_on_isolated_cpu(d.pid(), log);
        stop_cleanly(d);
    }
    restore_and_expect_the_host_as_before();
}

// What a cgroup v2 host running RT threads gets (a 6.1 partition cannot hold
// a service's thread, rtcore/isolation.hpp): the affinity fence.  Forced here
// on v1, the deployed way: host apply as root, then qrtd run as user qrtd.
TEST_F(dispatch_placement, with_the_affinity_fence_a_unit_like_run_reaches_the_isolated_cpu_alone) {
    std::string cfg;
    ASSERT_NO_FATAL_FAILURE(apply_fence_as_unit_would(cfg));
    {
        background d(as_unit(cfg, "+sys_nice,+ipc_lock,+bpf,+perfmon"), _base->path() / "fence.log");
        ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
        const std::string log = d.log();
        const auto [tid, cpu] = dispatch_thread_of(log);
        ASSERT_GT(tid, 0) << "no \"dispatch thread tid\" line:\n" << log;
        const auto st = thread_stat(d.pid(), tid);
        ASSERT_GE(st.size(), 39U) << "no /proc stat for tid " << tid;
        EXPECT_EQ(st[38], "1") << "policy (field 41) is not SCHED_FIFO\n" << log;
        EXPECT_EQ(thread_status_field(d.pid(), tid, "Cpus_allowed_list"), std::to_string(cpu)) << log;
        EXPECT_EQ(thread_status_field(d.pid(), d.pid(), "Cpus_allowed_list").find(std::to_string(cpu)),
                  std::string::npos)
            << "the main thread may run on the isolated CPU";
        stop_cleanly(d);
    }
    restore_and_expect_the_host_as_before();
}

// For real: on a fence host the drift watch (`qrtd host
// verify --repin`, what qrtd-repin.timer runs every 30 s) used to move the
// SCHED_FIFO dispatch thread off its isolated CPU with every other task, and
// say the host was as applied.  Two runs of it later the thread must still
// be SCHED_FIFO on its CPU and the only movable task allowed there; and a
// thread that something else moves (taskset) pins itself back.
TEST_F(dispatch_placement, with_the_fence_two_repin_runs_leave_the_dispatch_thread_alone_on_its_cpu) {
    std::string cfg;
    ASSERT_NO_FATAL_FAILURE(apply_fence_as_unit_would(cfg));
    {
        background d(as_unit(cfg, "+sys_nice,+ipc_lock,+bpf,+perfmon"), _base->path() / "fence-repin.log");
        ASSERT_TRUE(d.wait_log("daemon: running", 60)) << d.log();
        const auto [tid, cpu] = dispatch_thread_of(d.log());
        ASSERT_GT(tid, 0) << "no \"dispatch thread tid\" line:\n" << d.log();
        ASSERT_GE(cpu, 0);
        const std::string left = "left 1 qrt-dispatch thread(s) on their planned CPUs: tid " + std::to_string(tid) +
                                 " on CPU " + std::to_string(cpu);
        for (int round = 1; round <= 2; ++round) {
            const auto r = run(qrtd + " host verify --repin -c " + cfg + dirs());
            EXPECT_EQ(r.status, 0) << "round " << round << ":\n" << r.out << r.err;
            EXPECT_NE((r.out + r.err).find(left), std::string::npos) << "round " << round << ":\n" << r.out << r.err;
        }
        const auto st = thread_stat(d.pid(), tid);
        ASSERT_GE(st.size(), 39U) << "no /proc stat for tid " << tid;
        EXPECT_EQ(st[38], "1") << "policy (field 41) is not SCHED_FIFO";
        EXPECT_EQ(thread_status_field(d.pid(), tid, "Cpus_allowed_list"), std::to_string(cpu))
            << "the re-pin moved the dispatch thread off its CPU\n" << d.log();
        // Alone: every other task allowed on the CPU is one the kernel pins
        // (per-CPU kernel threads, io_uring workers).
        rtcore::real_task_ops tasks;
        const rtcore::host_fs host("/");
        auto all = tasks.list_tasks(host);
        ASSERT_TRUE(all) << all.err().message;
        std::vector<std::string> others;
        for (const auto& t : *all) {
            auto aff = tasks.affinity(t.tid);
            if (!aff || t.tid == tid || t.kernel_thread || t.per_cpu ||
                !aff->test(static_cast<unsigned>(cpu))) {
                continue;
            }
            others.push_back(std::to_string(t.tid) + " (" + t.comm + ") on " + aff->to_list());
        }
        EXPECT_TRUE(others.empty()) << "tasks left on the dispatch CPU: " << ::testing::PrintToString(others);

        // Moved by something else: it finds out and pins itself back.
        cpu_set_t hk;
        CPU_ZERO(&hk);
        for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) {
            if (static_cast<int>(c) != cpu) {
                CPU_SET(c, &hk);
            }
        }
        EXPECT_EQ(d.log().find("found itself moved"), std::string::npos) << "moved before the test moved it:\n"
                                                                          << d.log();
        ASSERT_EQ(::sched_setaffinity(tid, sizeof hk, &hk), 0) << std::strerror(errno);
        EXPECT_TRUE(d.wait_log("the dispatch thread found itself moved off CPU " + std::to_string(cpu), 10))
            << d.log();
        EXPECT_NE(d.log().find("re-pinned itself 1 times; now back on CPU " + std::to_string(cpu)),
                  std::string::npos)
            << d.log();
        EXPECT_EQ(thread_status_field(d.pid(), tid, "Cpus_allowed_list"), std::to_string(cpu)) << d.log();
        stop_cleanly(d);
    }
    restore_and_expect_the_host_as_before();
}

TEST_F(dispatch_placement, require_rt_refuses_with_exit_3_when_no_partition_makes_the_cpu_isolated) {
    hand_dirs_to(user());
    const auto cfg = config_with("qrtd", "require_rt = \"always\"\ncpu_dma_latency = false");
    background d(as_unit(cfg, "+sys_nice,+ipc_lock,+bpf,+perfmon"), _base->path() / "refused.log");
    const std::string log = refused_with_3(d);
    EXPECT_NE(log.find("dispatch: qpu qpu0: dispatch.require_rt (dispatch.require_rt = \"always\"): CPU 1 is planned "
                       "as isolated but no partition is applied: run `qrtd host apply` as root"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("refusing to run degraded (exit status 3)"), std::string::npos) << log;
    EXPECT_EQ(log.find("daemon: running"), std::string::npos) << log;
    expect_same_host(_before, "after the refusal");
}

TEST_F(dispatch_placement, require_rt_refuses_naming_sched_setattr_when_rtprio_is_0_without_cap_sys_nice) {
    hand_dirs_to(user());
    const auto cfg = config_with("qrtd", "cpu_dma_latency = false");
    ASSERT_NO_FATAL_FAILURE(apply(cfg));
    {
        background d(as_unit(cfg, "+ipc_lock", {"/usr/bin/prlimit", "--rtprio=0:0"}), _base->path() / "rtprio.log");
        const std::string log = refused_with_3(d);
        for (const char* s : {"dispatch.require_rt (dispatch.require_rt = \"auto\": started by systemd",
                              "the dispatch thread cannot run SCHED_FIFO on isolated CPU 1: sched_setattr(tid ",
                              "SCHED_FIFO, priority 80, SCHED_FLAG_RESET_ON_FORK): Operation not permitted: needs "
                              "CAP_SYS_NICE (missing) or RLIMIT_RTPRIO >= 80 (now 0; LimitRTPRIO= in the unit)",
                              "the daemon's cgroup is ", ":cpuset:/qrt-housekeeping",
                              "refusing to run degraded (exit status 3)"}) {
            EXPECT_NE(log.find(s), std::string::npos) << s << "\n" << log;
        }
    }
    restore_and_expect_the_host_as_before();
}
