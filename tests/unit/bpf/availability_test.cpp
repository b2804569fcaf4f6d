#include <gtest/gtest.h>

#include <filesystem>
#include <cerrno>
#include <fstream>

#include "drop_caps.hpp"
#include "qrt_bpf/availability.hpp"
#include "qrt_bpf/probe_set.hpp"

using namespace qrt_bpf;

namespace {

// A fake root with or without /sys/kernel/btf/vmlinux.
struct fake_root {
    std::filesystem::path dir;
    explicit fake_root(bool with_btf) {
        dir = std::filesystem::temp_directory_path() /
              ("qrt_bpf_avail_" + std::to_string(::getpid()) + (with_btf ? "_btf" : "_nobtf"));
        std::filesystem::create_directories(dir / "sys/kernel/btf");
        if (with_btf) {
            std::ofstream(dir / "sys/kernel/btf/vmlinux") << "BTF";
        }
    }
    ~fake_root() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

}  // namespace

TEST(availability, renders_available_or_unavailable_with_reason) {
    EXPECT_EQ(availability::ok().to_string(), "available");
    EXPECT_TRUE(availability::ok().available());
    const availability no = availability::unavailable("no kernel BTF");
    EXPECT_FALSE(no.available());
    EXPECT_EQ(no.to_string(), "unavailable (no kernel BTF)");
}

TEST(availability, preflight_without_kernel_btf_names_the_missing_file) {
    fake_root root(false);
    const availability a = preflight(rtcore::host_fs(root.dir));
    EXPECT_FALSE(a.available());
    if (built_with_probes()) {
        EXPECT_EQ(a.reason().rfind("no kernel BTF at /sys/kernel/btf/vmlinux", 0), 0U) << a.reason();
    } else {
        EXPECT_EQ(a.reason().rfind("built without probes", 0), 0U) << a.reason();
    }
}

TEST(availability, probe_set_without_btf_reports_instead_of_failing) {
    fake_root root(false);
    probe_config cfg;
    cfg.isolated_cpus = {0};
    probe_set set = probe_set::start(cfg, rtcore::host_fs(root.dir));
    EXPECT_FALSE(set.availability().available());
    EXPECT_EQ(set.wakeup(), nullptr);
    EXPECT_EQ(set.intrusions(), nullptr);
    EXPECT_EQ(set.outliers(), nullptr);
    EXPECT_NE(set.describe().find("wakeup: unavailable ("), std::string::npos) << set.describe();
    EXPECT_TRUE(set.add_tid(::getpid()).has_value()) << "nothing loaded, nothing to fail";
}

TEST(availability, disabled_probes_are_described_as_disabled) {
    fake_root root(false);
    probe_config cfg;
    cfg.intrusions = false;
    cfg.outliers = false;
    probe_set set = probe_set::start(cfg, rtcore::host_fs(root.dir));
    EXPECT_NE(set.describe().find("intrusions: disabled"), std::string::npos) << set.describe();
    EXPECT_NE(set.describe().find("outliers: disabled"), std::string::npos) << set.describe();
}

TEST(availability, a_build_without_probes_says_so_from_every_loader) {
    if (built_with_probes()) {
        GTEST_SKIP() << "this build has probes";
    }
    auto w = wakeup_probe::load({});
    ASSERT_FALSE(w);
    EXPECT_EQ(w.err().code, ENOTSUP);
    EXPECT_EQ(w.err().message.rfind("built without probes", 0), 0U) << w.err().message;
    intrusion_options io;
    io.isolated_cpus = {0};
    EXPECT_FALSE(intrusion_probe::load(io));
    EXPECT_FALSE(outlier_probe::load({}));
}

TEST(availability, preflight_names_each_missing_capability) {
    if (!built_with_probes()) {
        GTEST_SKIP() << "qrt_bpf built without probes: " << built_without_reason();
    }
    fake_root root(true);
    const rtcore::host_fs fs(root.dir);
    const auto none = qrt::testing::run_in_child([&fs](std::string& out) {
        if (!qrt_bpf_test::drop_caps_except({})) {
            return 3;
        }
        out = preflight(fs).to_string();
        return 0;
    });
    ASSERT_EQ(none.exit_code, 0) << none.reply;
    EXPECT_EQ(none.reply, "unavailable (missing capability CAP_BPF and CAP_PERFMON)");

    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to hold CAP_BPF before dropping CAP_PERFMON";
    }
    const auto bpf_only = qrt::testing::run_in_child([&fs](std::string& out) {
        if (!qrt_bpf_test::drop_caps_except({CAP_BPF})) {
            return 3;
        }
        out = preflight(fs).to_string();
        return 0;
    });
    ASSERT_EQ(bpf_only.exit_code, 0) << bpf_only.reply;
    EXPECT_EQ(bpf_only.reply, "unavailable (missing capability CAP_PERFMON)");
}
