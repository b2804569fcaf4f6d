// The config table, loader and generated reference.  Every bad-config case
// checks the exact message a user sees.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "qrt/config.hpp"
#include "qrt/config_table.hpp"

namespace {

using qrt::parse_config;

// A valid [[qpu]] to append to snippets that test other sections.
constexpr const char* one_qpu = "\n[[qpu]]\nname = \"q0\"\nendpoint = \"unix:///run/q0.sock\"\n";

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// The single error a snippet gives, as printed.
std::string only_error(const std::string& text, const qrt::config_load_options& opts = {}) {
    auto res = parse_config(text, "qrtd.toml", opts);
    if (res.errors.size() != 1) {
        return "expected one error, got " + std::to_string(res.errors.size()) + ":\n" +
               res.error_text();
    }
    return res.errors[0].to_string();
}

TEST(config_reference, file_in_the_tree_is_byte_equal_to_the_generated_reference) {
    const std::string file = read_file(QRT_SOURCE_DIR "/config/qrtd.toml");
    ASSERT_FALSE(file.empty()) << "config/qrtd.toml missing";
    EXPECT_EQ(file, qrt::reference_toml())
        << "regenerate it: qrtd config-reference > config/qrtd.toml";
}

TEST(config_reference, parses_back_to_the_defaults) {
    auto res = parse_config(qrt::reference_toml(), "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    EXPECT_EQ(res.cfg, qrt::default_config());
}

TEST(config_reference, lists_every_option_of_the_table) {
    const std::string ref = qrt::reference_toml();
    for (const auto& opt : qrt::config_table()) {
        EXPECT_NE(ref.find("\n" + std::string(opt.key) + " = "), std::string::npos) << opt.full_name();
    }
}

TEST(config_reference, man_page_holds_the_generated_option_list) {
    const std::string man = read_file(QRT_SOURCE_DIR "/agent/man/qrtd.toml.5");
    ASSERT_FALSE(man.empty()) << "agent/man/qrtd.toml.5 missing";
    EXPECT_NE(man.find(qrt::reference_roff()), std::string::npos)
        << "paste `qrtd config-reference --roff` into the OPTIONS section of qrtd.toml.5";
    for (const auto& opt : qrt::config_table()) {
        EXPECT_NE(man.find(".B " + std::string(opt.key) + "\n"), std::string::npos) << opt.full_name();
    }
}

TEST(config_defaults, a_file_with_only_a_qpu_takes_every_other_default) {
    auto res = parse_config(one_qpu, "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    const auto& def = qrt::default_config();
    EXPECT_EQ(res.cfg.agent, def.agent);
    EXPECT_EQ(res.cfg.host, def.host);
    EXPECT_EQ(res.cfg.dispatch, def.dispatch);
    EXPECT_EQ(res.cfg.timeline, def.timeline);
    EXPECT_EQ(res.cfg.rpc, def.rpc);
    EXPECT_EQ(res.cfg.roles, def.roles);
    EXPECT_EQ(res.cfg.probes, def.probes);
    ASSERT_EQ(res.cfg.qpus.size(), 1u);
    EXPECT_EQ(res.cfg.qpus[0].name, "q0");
    EXPECT_EQ(res.cfg.qpus[0].target.path, "/run/q0.sock");
    EXPECT_EQ(res.cfg.qpus[0].dispatch_cpu, -1);
    EXPECT_EQ(res.cfg.qpus[0].effective_job_tolerance_ns(res.cfg), def.dispatch.miss_tolerance_ns);
}

TEST(config_defaults, typed_fields_hold_the_documented_defaults) {
    const auto& c = qrt::default_config();
    EXPECT_EQ(c.agent.state_dir, QRT_DEFAULT_STATE_DIR);
    EXPECT_EQ(c.agent.level, qrt::log_level::info);
    EXPECT_FALSE(c.host.isolated_cpus.has_value());
    EXPECT_EQ(c.host.isolation, qrt::isolation_mode::automatic);
    EXPECT_EQ(c.dispatch.priority, 80);
    EXPECT_EQ(c.dispatch.lead_quantile, 0.999);
    EXPECT_EQ(c.timeline.policy, qrt::placement_policy::edf_backfill);
    EXPECT_EQ(c.rpc.socket_path, QRT_DEFAULT_SOCKET_PATH);
    EXPECT_EQ(c.rpc.socket_mode, 0660u);
    ASSERT_EQ(c.roles.admin.size(), 1u);
    EXPECT_EQ(c.roles.admin[0].type, qrt::principal::kind::uid);
    EXPECT_EQ(c.roles.admin[0].id, 0u);
}

TEST(config_defaults, a_changed_config_round_trips_through_its_rendering) {
    qrt::config c = qrt::default_config();
    c.agent.level = qrt::log_level::debug;
    c.host.isolated_cpus = rtcore::cpu_set{2, 3};
    c.dispatch.priority = 42;
    c.dispatch.lead_quantile = 0.95;
    c.rpc.socket_mode = 0640;
    c.roles.calibration = {*qrt::parse_principal("user:calib"), *qrt::parse_principal("gid:1234")};
    qrt::qpu_config second = c.qpus[0];
    second.name = "q1";
    second.target = *qrt::parse_endpoint("tcp://[::1]:9001");
    second.dispatch_cpu = 3;
    c.qpus[0].dispatch_cpu = 2;
    c.qpus.push_back(second);
    auto res = parse_config(qrt::render_config(c), "rendered.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    EXPECT_EQ(res.cfg, c);
}

TEST(config_table, enumerations_list_the_names_of_their_enum_in_order) {
    const auto* iso = qrt::find_option("host", "isolation");
    ASSERT_NE(iso, nullptr);
    ASSERT_EQ(iso->allowed.size(), qrt::enum_names<qrt::isolation_mode>::names.size());
    for (std::size_t i = 0; i < iso->allowed.size(); ++i) {
        EXPECT_EQ(iso->allowed[i], qrt::to_string(static_cast<qrt::isolation_mode>(i)));
    }
    EXPECT_EQ(qrt::find_option("dispatch", "nonexistent"), nullptr);
}

TEST(config_table, every_option_has_a_meaning_and_store_and_load) {
    for (const auto& opt : qrt::config_table()) {
        EXPECT_FALSE(opt.meaning.empty()) << opt.full_name();
        EXPECT_NE(opt.store, nullptr) << opt.full_name();
        EXPECT_NE(opt.load, nullptr) << opt.full_name();
        EXPECT_FALSE(qrt::section_meaning(opt.section).empty()) << opt.section;
    }
}

TEST(config_json, has_every_option) {
    const auto j = qrt::config_to_json(qrt::default_config());
    for (const auto& opt : qrt::config_table()) {
        if (opt.section == "qpu") {
            EXPECT_TRUE(j["qpu"][0].contains(std::string(opt.key))) << opt.full_name();
        } else {
            EXPECT_TRUE(j[std::string(opt.section)].contains(std::string(opt.key))) << opt.full_name();
        }
    }
    EXPECT_EQ(j["dispatch"]["priority"], 80);
    EXPECT_EQ(j["rpc"]["socket_mode"], "0660");
}

// ---- bad input: the exact messages ----------------------------------------

TEST(config_errors, malformed_toml_gives_the_parsers_line_and_column) {
    EXPECT_EQ(only_error("[dispatch]\npriority = 80\nmode = tuned\n"),
              "qrtd.toml:3:9: malformed TOML: Error while parsing boolean: expected 'true', saw 'tu'");
}

TEST(config_errors, out_of_range_integer) {
    EXPECT_EQ(only_error(std::string("[dispatch]\n\npriority = 150\n") + one_qpu),
              "qrtd.toml:3: dispatch.priority = 150 is out of range 1..99");
}

TEST(config_errors, out_of_range_float_and_duration) {
    EXPECT_EQ(only_error(std::string("[dispatch]\nlead_quantile = 1.5\n") + one_qpu),
              "qrtd.toml:2: dispatch.lead_quantile = 1.5 is out of range 0.5..1");
    EXPECT_EQ(only_error(std::string("[probes]\noutlier_threshold_ns = 10\n") + one_qpu),
              "qrtd.toml:2: probes.outlier_threshold_ns = 10 is out of range 1000..1000000000");
}

TEST(config_errors, wrong_types_say_what_was_expected) {
    EXPECT_EQ(only_error(std::string("[dispatch]\npriority = \"high\"\n") + one_qpu),
              "qrtd.toml:2: dispatch.priority = \"high\": expected an integer (1..99), got a string");
    EXPECT_EQ(only_error(std::string("[host]\npin_irqs = 1\n") + one_qpu),
              "qrtd.toml:2: host.pin_irqs = 1: expected a boolean (true or false), got an integer");
    EXPECT_EQ(only_error(std::string("[dispatch]\nlead_min_ns = 1.5\n") + one_qpu),
              "qrtd.toml:2: dispatch.lead_min_ns = 1.5: expected an integer (0..10000000), got a float");
    EXPECT_EQ(only_error(std::string("[roles]\nadmin = \"uid:0\"\n") + one_qpu),
              "qrtd.toml:2: roles.admin = \"uid:0\": expected an array of strings, got a string");
    EXPECT_EQ(only_error(std::string("dispatch = 3\n") + one_qpu),
              "qrtd.toml:1: dispatch must be a table [dispatch], not an integer");
}

TEST(config_errors, enum_values_list_the_allowed_ones) {
    EXPECT_EQ(only_error(std::string("[timeline]\npolicy = \"random\"\n") + one_qpu),
              "qrtd.toml:2: timeline.policy = \"random\" is not one of fifo, edf-backfill, "
              "priority-preempt, fidelity-aware");
}

TEST(config_errors, a_runtime_knob_that_does_not_exist_names_the_ones_that_do) {
    const std::string text = std::string("[host]\nruntime_knobs = [\"workqueues\", \"nohz_full\"]\n") + one_qpu;
    const std::string e = only_error(text);
    EXPECT_NE(e.find("qrtd.toml:2: host.runtime_knobs"), std::string::npos) << e;
    EXPECT_NE(e.find("nohz_full"), std::string::npos) << e;
    EXPECT_NE(e.find("must be one of workqueues, kthreads, vm_stat_interval, timer_migration, watchdog_cpumask, "
                     "mce_ignore_ce"),
              std::string::npos)
        << e;
}

TEST(config_errors, unknown_keys_and_sections_are_errors_with_suggestions) {
    EXPECT_EQ(only_error(std::string("[dispatch]\npriorty = 3\n") + one_qpu),
              "qrtd.toml:2: unknown option dispatch.priorty (did you mean dispatch.priority?)");
    EXPECT_EQ(only_error(std::string("[dispach]\npriority = 3\n") + one_qpu),
              "qrtd.toml:1: unknown section [dispach] (did you mean [dispatch]?)");
    EXPECT_EQ(only_error(std::string("[extras]\nx = 1\n") + one_qpu),
              "qrtd.toml:1: unknown section [extras]");
    EXPECT_EQ(only_error(std::string("priority = 3\n") + one_qpu),
              "qrtd.toml:1: unknown option priority outside any section (did you mean "
              "dispatch.priority?)");
    EXPECT_EQ(only_error(std::string(one_qpu) + "colour = \"blue\"\n"),
              "qrtd.toml:5: unknown option qpu[0].colour");
}

TEST(config_errors, every_error_of_a_file_is_reported_in_line_order) {
    auto res = parse_config(std::string("[dispatch]\npriority = 0\n[rpc]\nmax_inflight = 0\n") + one_qpu,
                            "qrtd.toml");
    ASSERT_EQ(res.errors.size(), 2u) << res.error_text();
    EXPECT_EQ(res.errors[0].line, 2u);
    EXPECT_EQ(res.errors[0].option, "dispatch.priority");
    EXPECT_EQ(res.errors[1].line, 4u);
    EXPECT_EQ(res.errors[1].option, "rpc.max_inflight");
}

TEST(config_errors, isolated_cpus_must_be_online) {
    qrt::config_load_options opts;
    opts.online_cpus = rtcore::cpu_set{0, 1, 2, 3};
    EXPECT_EQ(only_error(std::string("[host]\nisolated_cpus = \"2-5\"\n") + one_qpu, opts),
              "qrtd.toml:2: host.isolated_cpus = \"2-5\" names CPUs that are not online: 4-5 "
              "(online: 0-3)");
}

TEST(config_errors, isolated_cpus_may_not_cover_every_cpu) {
    qrt::config_load_options opts;
    opts.online_cpus = rtcore::cpu_set{0, 1};
    EXPECT_EQ(only_error(std::string("[host]\nisolated_cpus = \"0-1\"\n") + one_qpu, opts),
              "qrtd.toml:2: host.isolated_cpus = \"0-1\" covers every online CPU (0-1): at least "
              "one core must stay for housekeeping");
}

TEST(config_errors, isolated_cpus_syntax) {
    const auto msg = only_error(std::string("[host]\nisolated_cpus = \"2-x\"\n") + one_qpu);
    EXPECT_EQ(msg.rfind("qrtd.toml:2: host.isolated_cpus = \"2-x\" is not \"auto\" or a CPU list: ", 0), 0u)
        << msg;
}

TEST(config_errors, dispatch_cpu_must_be_online_and_isolated) {
    qrt::config_load_options opts;
    opts.online_cpus = rtcore::cpu_set{0, 1, 2, 3};
    EXPECT_EQ(only_error(std::string(one_qpu) + "dispatch_cpu = 7\n", opts),
              "qrtd.toml:5: qpu[0].dispatch_cpu = 7 is not an online CPU (online: 0-3)");
    EXPECT_EQ(only_error(std::string("[host]\nisolated_cpus = \"3\"\n") + one_qpu + "dispatch_cpu = 2\n", opts),
              "qrtd.toml:7: qpu[0].dispatch_cpu = 2 is not in host.isolated_cpus (3)");
}

TEST(config_errors, bad_endpoint_urls) {
    auto endpoint_error = [](const std::string& url) {
        return only_error("[[qpu]]\nname = \"q0\"\nendpoint = \"" + url + "\"\n");
    };
    EXPECT_EQ(endpoint_error("http://10.0.0.1/"),
              "qrtd.toml:3: qpu[0].endpoint = \"http://10.0.0.1/\" is not a valid endpoint: scheme "
              "must be unix://, tcp:// or file://");
    EXPECT_EQ(endpoint_error("unix://relative.sock"),
              "qrtd.toml:3: qpu[0].endpoint = \"unix://relative.sock\" is not a valid endpoint: "
              "unix:// needs an absolute path (unix:///run/qpu0.sock)");
    EXPECT_EQ(endpoint_error("tcp://127.0.0.1:70000"),
              "qrtd.toml:3: qpu[0].endpoint = \"tcp://127.0.0.1:70000\" is not a valid endpoint: "
              "tcp:// port \"70000\" is not in 1..65535");
    EXPECT_EQ(endpoint_error("tcp://qpu.lab:9000"),
              "qrtd.toml:3: qpu[0].endpoint = \"tcp://qpu.lab:9000\" is not a valid endpoint: "
              "tcp:// address \"qpu.lab\" is not an IP address literal (host names are not "
              "resolved: the dispatch path does no DNS)");
    EXPECT_EQ(endpoint_error("file:///etc/passwd"),
              "qrtd.toml:3: qpu[0].endpoint = \"file:///etc/passwd\" is not a valid endpoint: "
              "file:// must name a device under /dev (file:///dev/qpu0)");
}

TEST(config_errors, wire_2_needs_a_socket_endpoint_and_an_arm_lead_needs_wire_2) {
    EXPECT_EQ(only_error("[[qpu]]\nname = \"a\"\nendpoint = \"file:///dev/null\"\nwire = 2\n"),
              "qrtd.toml:4: qpu[0].wire = 2 needs two connections to the endpoint; qpu[0].endpoint = "
              "\"file:///dev/null\" is a file: give a unix:// or tcp:// endpoint, or wire = 1");
    EXPECT_EQ(only_error(std::string(one_qpu) + "arm_lead_ns = 300_000_000\n"),
              "qrtd.toml:5: qpu[0].arm_lead_ns = 300000000 is for wire = 2 (qpu[0].wire = 1): a version-1 job "
              "is never armed");
    EXPECT_EQ(only_error(std::string(one_qpu) + "wire = 3\n"),
              "qrtd.toml:5: qpu[0].wire = 3 is out of range 1..2");
}

TEST(config_errors, duplicate_qpu_names) {
    EXPECT_EQ(only_error("[[qpu]]\nname = \"a\"\nendpoint = \"unix:///a\"\n"
                         "[[qpu]]\nname = \"a\"\nendpoint = \"unix:///b\"\n"),
              "qrtd.toml:5: qpu[1].name = \"a\" is already the name of qpu[0] (line 1)");
}

TEST(config_errors, qpu_required_keys_and_at_least_one_qpu) {
    EXPECT_EQ(only_error("[[qpu]]\nendpoint = \"unix:///a\"\n"),
              "qrtd.toml:1: qpu[0]: missing required option name");
    EXPECT_EQ(only_error("[agent]\n"), "qrtd.toml: no [[qpu]] table: declare at least one QPU");
    EXPECT_EQ(only_error("[qpu]\nname = \"a\"\n"),
              "qrtd.toml:1: qpu must be an array of tables: write each QPU as [[qpu]]");
}

TEST(config_errors, cross_field_checks) {
    EXPECT_EQ(only_error(std::string(one_qpu) + "period_ns = 1_000_000_000\nblackout_ns = 1_000_000_000\n"),
              "qrtd.toml:6: qpu[0].blackout_ns = 1000000000 must be less than qpu[0].period_ns = "
              "1000000000");
    EXPECT_EQ(only_error(std::string("[dispatch]\nlead_min_ns = 60_000\nlead_max_ns = 50_000\n") + one_qpu),
              "qrtd.toml:3: dispatch.lead_min_ns = 60000 is greater than dispatch.lead_max_ns = 50000");
    EXPECT_EQ(only_error(std::string("[rpc]\nmax_connections = 8\nreserved_connections = 8\n") + one_qpu),
              "qrtd.toml:3: rpc.reserved_connections = 8 leaves no connection of "
              "rpc.max_connections = 8 to schedulers and readers: it must be less");
    EXPECT_EQ(only_error(std::string("[dispatch]\nring_capacity = 1000\n") + one_qpu),
              "qrtd.toml:2: dispatch.ring_capacity = 1000 is not a power of two");
    EXPECT_EQ(only_error(std::string("[dispatch]\nring_capacity = 65536\nmax_payload_bytes = 1_048_576\n") + one_qpu),
              "qrtd.toml:3: dispatch.ring_capacity = 65536 with dispatch.max_payload_bytes = 1048576 needs 65544 "
              "MiB of locked frame buffers per QPU (limit 1024 MiB): lower one of them");
    qrt::config_load_options two_cpus;
    two_cpus.online_cpus = rtcore::cpu_set{0, 1};
    EXPECT_EQ(only_error(std::string("[dispatch]\nsubmit_mode = \"sqpoll\"\nsqpoll_cpu = 7\n") + one_qpu, two_cpus),
              "qrtd.toml:3: dispatch.sqpoll_cpu = 7 is not an online CPU (online: 0-1)");
}

TEST(config_values, submit_mode_and_sqpoll_options) {
    auto res = parse_config(std::string("[dispatch]\nsubmit_mode = \"sqpoll\"\nsqpoll_cpu = 1\nsqpoll_idle_ms = 20\n") +
                            one_qpu, "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    EXPECT_EQ(res.cfg.dispatch.submit, qrt::submit_mode::sqpoll);
    EXPECT_EQ(res.cfg.dispatch.sqpoll_cpu, 1);
    EXPECT_EQ(res.cfg.dispatch.sqpoll_idle_ms, 20u);
    EXPECT_EQ(qrt::default_config().dispatch.submit, qrt::submit_mode::automatic)
        << "auto is the default: the partition decides (qrt/dispatch/submit_choice.hpp)";
    EXPECT_EQ(only_error(std::string("[dispatch]\nsubmit_mode = \"polled\"\n") + one_qpu),
              "qrtd.toml:2: dispatch.submit_mode = \"polled\" is not one of syscall, sqpoll, auto");
}

TEST(config_values, probes_flavour_forces_raw_tp_or_lets_the_loader_choose) {
    EXPECT_EQ(qrt::default_config().probes.flavour, qrt::probe_flavour::automatic);
    auto res = parse_config(std::string("[probes]\nflavour = \"raw_tp\"\n") + one_qpu, "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    EXPECT_EQ(res.cfg.probes.flavour, qrt::probe_flavour::raw_tp);
    EXPECT_EQ(only_error(std::string("[probes]\nflavour = \"tp_btf\"\n") + one_qpu),
              "qrtd.toml:2: probes.flavour = \"tp_btf\" is not one of auto, raw_tp");
}

TEST(config_errors, string_syntax_checks) {
    EXPECT_EQ(only_error(std::string("[rpc]\nsocket_mode = \"4755\"\n") + one_qpu),
              "qrtd.toml:2: rpc.socket_mode = \"4755\" must not set setuid, setgid or sticky bits "
              "(at most 0777)");
    EXPECT_EQ(only_error(std::string("[agent]\nstate_dir = \"var/lib\"\n") + one_qpu),
              "qrtd.toml:2: agent.state_dir = \"var/lib\" must be an absolute path");
    EXPECT_EQ(only_error(std::string("[roles]\nreader = [\"group:qrt\", \"team:x\"]\n") + one_qpu),
              "qrtd.toml:2: roles.reader[1] = \"team:x\" is not user:NAME, group:NAME, uid:N or gid:N");
}

TEST(config_errors, unreadable_file_names_the_path_and_the_cause) {
    auto res = qrt::load_config_file("/nonexistent/qrtd.toml");
    ASSERT_EQ(res.errors.size(), 1u);
    EXPECT_EQ(res.errors[0].to_string(), "/nonexistent/qrtd.toml: cannot read: No such file or directory");
}

// ---- value syntaxes -------------------------------------------------------

TEST(config_values, endpoints_parse_into_their_parts) {
    auto u = qrt::parse_endpoint("unix:///run/qrtd/qpu0.sock");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->type, qrt::endpoint::kind::unix_socket);
    EXPECT_EQ(u->path, "/run/qrtd/qpu0.sock");
    auto t = qrt::parse_endpoint("tcp://127.0.0.1:9000");
    ASSERT_TRUE(t);
    EXPECT_EQ(t->type, qrt::endpoint::kind::tcp);
    EXPECT_EQ(t->host, "127.0.0.1");
    EXPECT_EQ(t->port, 9000);
    auto t6 = qrt::parse_endpoint("tcp://[::1]:9001");
    ASSERT_TRUE(t6);
    EXPECT_EQ(t6->host, "::1");
    auto f = qrt::parse_endpoint("file:///dev/qpu0");
    ASSERT_TRUE(f);
    EXPECT_EQ(f->type, qrt::endpoint::kind::device_file);
    EXPECT_FALSE(qrt::parse_endpoint("file:///dev/../etc/shadow"));
    EXPECT_FALSE(qrt::parse_endpoint("unix:///" + std::string(120, 'x')));
}

TEST(config_values, principals) {
    auto g = qrt::parse_principal("group:qrt");
    ASSERT_TRUE(g);
    EXPECT_EQ(g->type, qrt::principal::kind::group);
    EXPECT_EQ(g->name, "qrt");
    auto u = qrt::parse_principal("uid:1000");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->id, 1000u);
    EXPECT_FALSE(qrt::parse_principal("uid:-1"));
    EXPECT_FALSE(qrt::parse_principal("user:"));
    EXPECT_FALSE(qrt::parse_principal("qrt"));
}

}  // namespace

TEST(config_tenants, priority_ceilings_parse_and_a_bad_entry_names_what_is_wrong) {
    const std::string qpu = "[[qpu]]\nname = \"q0\"\nendpoint = \"unix:///run/q0.sock\"\n";
    auto res = parse_config("[tenants]\npriority_ceilings = [\"user:alice=50\", \"gid:7=-3\"]\n"
                            "max_reservations = 5\n" + qpu,
                            "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    ASSERT_EQ(res.cfg.tenants.priority_ceilings.size(), 2u);
    EXPECT_EQ(res.cfg.tenants.priority_ceilings[0].who.name, "alice");
    EXPECT_EQ(res.cfg.tenants.priority_ceilings[0].max_priority, 50);
    EXPECT_EQ(res.cfg.tenants.priority_ceilings[1].max_priority, -3);
    EXPECT_EQ(res.cfg.tenants.max_reservations, 5u);
    EXPECT_EQ(res.cfg.tenants.scheduler_max_priority, 0);
    const std::string err = only_error("[tenants]\npriority_ceilings = [\"user:alice\"]\n" + qpu);
    EXPECT_NE(err.find("tenants.priority_ceilings"), std::string::npos) << err;
    EXPECT_NE(err.find("PRINCIPAL=N"), std::string::npos) << err;
    const std::string big = only_error("[tenants]\npriority_ceilings = [\"uid:5=99999999999\"]\n" + qpu);
    EXPECT_NE(big.find("is not a priority"), std::string::npos) << big;
}

// ---- [qpu.device] (the per-QPU facts the SDKs build on) ------------------

constexpr const char* device_qpu =
    "[[qpu]]\nname = \"q0\"\nendpoint = \"unix:///run/q0.sock\"\n"
    "[qpu.device]\n";

TEST(config_device, absent_sub_table_is_no_device_and_serves_null) {
    auto res = parse_config(one_qpu, "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    EXPECT_FALSE(res.cfg.qpus[0].device.has_value());
    EXPECT_TRUE(qrt::device_to_json(res.cfg.qpus[0].device).is_null());
    EXPECT_TRUE(qrt::config_to_json(res.cfg)["qpu"][0]["device"].is_null());
}

TEST(config_device, a_full_sub_table_is_stored_and_served_with_exactly_its_keys) {
    auto res = parse_config(std::string(device_qpu) +
                                "qubits = 3\ntechnology = \"superconducting\"\n"
                                "basis_gates = [\"rz\", \"sx\", \"x\", \"cx\", \"measure\"]\n"
                                "coupling_map = [[0, 1], [1, 0], [1, 2], [2, 1]]\n"
                                "gate_durations_ns = { cx = 300, sx = 35, x = 35, rz = 0, measure = 1000 }\n"
                                "max_shots = 20000\n",
                            "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    ASSERT_TRUE(res.cfg.qpus[0].device.has_value());
    const auto& d = *res.cfg.qpus[0].device;
    EXPECT_EQ(d.qubits, 3u);
    EXPECT_EQ(d.technology, "superconducting");
    EXPECT_EQ(d.basis_gates, (std::vector<std::string>{"rz", "sx", "x", "cx", "measure"}));
    ASSERT_EQ(d.coupling_map.size(), 4u);
    EXPECT_EQ(d.coupling_map[2], (std::array<std::uint32_t, 2>{1, 2}));
    EXPECT_EQ(d.max_shots, 20000u);
    const nlohmann::json j = qrt::device_to_json(d);
    EXPECT_EQ(j, nlohmann::json::parse(R"({"qubits":3,"technology":"superconducting",
        "basis_gates":["rz","sx","x","cx","measure"],"coupling_map":[[0,1],[1,0],[1,2],[2,1]],
        "gate_durations_ns":{"cx":300,"sx":35,"x":35,"rz":0,"measure":1000},"max_shots":20000})"));
    // A rendered config with a device parses back to the same config.
    auto again = parse_config(qrt::render_config(res.cfg), "again.toml");
    ASSERT_TRUE(again.ok()) << again.error_text();
    EXPECT_EQ(again.cfg, res.cfg);
}

TEST(config_device, only_qubits_is_required_and_max_shots_defaults) {
    auto res = parse_config(std::string(device_qpu) + "qubits = 2\n", "qrtd.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    EXPECT_EQ(res.cfg.qpus[0].device->max_shots, 100000u);
    EXPECT_EQ(only_error(std::string(device_qpu) + "technology = \"ion-trap\"\n"),
              "qrtd.toml:4: qpu[0].device: missing required option qubits");
}

TEST(config_device, bad_values_are_refused_naming_the_key) {
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 0\n"),
              "qrtd.toml:5: qpu[0].device.qubits = 0 is out of range 1..1024");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 1025\n"),
              "qrtd.toml:5: qpu[0].device.qubits = 1025 is out of range 1..1024");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = \"two\"\n"),
              "qrtd.toml:5: qpu[0].device.qubits = \"two\": expected an integer (1..1024), got a string");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\nmax_shots = 0\n"),
              "qrtd.toml:6: qpu[0].device.max_shots = 0 is out of range 1..1000000");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\ncoupling_map = [[0, 2]]\n"),
              "qrtd.toml:6: qpu[0].device.coupling_map[0] = [0, 2] names a qubit not below "
              "qpu[0].device.qubits = 2");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\ncoupling_map = [[0, 1, 2]]\n"),
              "qrtd.toml:6: qpu[0].device.coupling_map[0] = [0, 1, 2] is not a pair [control, target] of "
              "qubit indices");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\ncoupling_map = [[1, 1]]\n"),
              "qrtd.toml:6: qpu[0].device.coupling_map[0] = [1, 1] couples a qubit to itself");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\nbasis_gates = [\"c x\"]\n"),
              "qrtd.toml:6: qpu[0].device.basis_gates[0] = \"c x\" is not a gate name (1..32 characters of "
              "[A-Za-z0-9_])");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\nbasis_gates = [\"x\"]\n"
                                                   "gate_durations_ns = { cx = 300 }\n"),
              "qrtd.toml:7: qpu[0].device.gate_durations_ns.cx names a gate that is not in "
              "qpu[0].device.basis_gates");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\ngate_durations_ns = { x = -1 }\n"),
              "qrtd.toml:6: qpu[0].device.gate_durations_ns.x = -1 is not an integer of nanoseconds in "
              "0..3600000000000");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\ntechnology = \"" + std::string(65, 't') + "\"\n"),
              "qrtd.toml:6: qpu[0].device.technology is 65 characters, at most 64");
    EXPECT_EQ(only_error(std::string(device_qpu) + "qubits = 2\nqbits = 2\n"),
              "qrtd.toml:6: unknown option qpu[0].device.qbits (known: qubits, technology, basis_gates, "
              "coupling_map, gate_durations_ns, max_shots)");
    std::string many = "qubits = 2\nbasis_gates = [";
    for (int i = 0; i < 65; ++i) {
        many += (i != 0 ? ", \"g" : "\"g") + std::to_string(i) + "\"";
    }
    EXPECT_EQ(only_error(std::string(device_qpu) + many + "]\n"),
              "qrtd.toml:6: qpu[0].device.basis_gates has 65 gates, at most 64");
    EXPECT_EQ(only_error("[[qpu]]\nname = \"q0\"\nendpoint = \"unix:///run/q0.sock\"\ndevice = 3\n"),
              "qrtd.toml:4: qpu[0].device must be a table [qpu.device], not an integer");
}

TEST(config_device, the_shipped_three_qubit_example_loads) {
    auto res = qrt::load_config_file(QRT_SOURCE_DIR "/config/qpu-line3.toml");
    ASSERT_TRUE(res.ok()) << res.error_text();
    ASSERT_EQ(res.cfg.qpus.size(), 1u);
    ASSERT_TRUE(res.cfg.qpus[0].device.has_value());
    EXPECT_EQ(res.cfg.qpus[0].device->qubits, 3u);
    EXPECT_EQ(res.cfg.qpus[0].device->coupling_map.size(), 4u);
}
