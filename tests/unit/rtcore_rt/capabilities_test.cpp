#include <gtest/gtest.h>

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "qrt_test/process.hpp"
#include "rtcore/capabilities.hpp"

using qrt::testing::run_in_child;

namespace {
bool root_with_setpcap() {
    return ::geteuid() == 0 && rtcore::has_capability(CAP_SETPCAP) && rtcore::has_capability(CAP_SYS_NICE);
}
}  // namespace

TEST(capabilities, names_capabilities_the_way_the_man_page_does) {
    EXPECT_EQ(rtcore::capability_name(CAP_SYS_NICE), "CAP_SYS_NICE");
    EXPECT_EQ(rtcore::capability_name(CAP_IPC_LOCK), "CAP_IPC_LOCK");
    EXPECT_EQ(rtcore::capability_name(CAP_BPF), "CAP_BPF");
    EXPECT_EQ(rtcore::capability_name(200), "CAP_200");
    EXPECT_EQ(*rtcore::capability_from_name("CAP_SYS_NICE"), CAP_SYS_NICE);
    EXPECT_EQ(*rtcore::capability_from_name("ipc_lock"), CAP_IPC_LOCK);
    const auto bad = rtcore::capability_from_name("CAP_FLY");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.err().message, "unknown capability \"CAP_FLY\"");
}

TEST(capabilities, require_passes_when_every_capability_is_effective) {
    if (!rtcore::has_capability(CAP_SYS_NICE) || !rtcore::has_capability(CAP_IPC_LOCK)) {
        GTEST_SKIP() << "needs CAP_SYS_NICE and CAP_IPC_LOCK (run as root)";
    }
    EXPECT_TRUE(rtcore::require_capabilities({CAP_SYS_NICE, CAP_IPC_LOCK}, "dispatch thread setup"));
    EXPECT_TRUE(rtcore::require_capabilities({}, "nothing"));
}

TEST(capabilities, drop_keeps_only_what_is_asked_and_require_names_the_rest) {
    if (!root_with_setpcap()) {
        GTEST_SKIP() << "needs root with CAP_SETPCAP to drop capabilities in a child";
    }
    const auto r = run_in_child([]() -> std::string {
        auto rep = rtcore::drop_capabilities_except({CAP_SYS_NICE});
        if (!rep) {
            return "drop failed: " + rep.err().message;
        }
        std::string bad;
        if (!rtcore::has_capability(CAP_SYS_NICE)) {
            bad += "lost CAP_SYS_NICE;";
        }
        if (rtcore::has_capability(CAP_NET_ADMIN) || rtcore::has_permitted_capability(CAP_NET_ADMIN)) {
            bad += "still has CAP_NET_ADMIN;";
        }
        if (cap_get_bound(CAP_NET_ADMIN) != 0) {
            bad += "CAP_NET_ADMIN still in the bounding set;";
        }
        if (cap_get_bound(CAP_SYS_NICE) != 1) {
            bad += "CAP_SYS_NICE dropped from the bounding set;";
        }
        if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
            bad += "no_new_privs not set;";
        }
        if (!rep->bounding_set_dropped || !rep->no_new_privs) {
            bad += "report incomplete;";
        }
        if (rep->kept != std::vector<std::string>{"CAP_SYS_NICE"}) {
            bad += "kept list wrong;";
        }
        if (std::find(rep->dropped.begin(), rep->dropped.end(), "CAP_NET_ADMIN") == rep->dropped.end()) {
            bad += "CAP_NET_ADMIN not reported dropped;";
        }
        // The kept capability still works: SCHED_FIFO for this child.
        sched_param sp{};
        sp.sched_priority = 1;
        if (::sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
            bad += "SCHED_FIFO refused with CAP_SYS_NICE kept;";
        }
        const auto st = rtcore::require_capabilities({CAP_SYS_NICE, CAP_IPC_LOCK, CAP_BPF}, "dispatch thread setup");
        if (st) {
            bad += "require passed without CAP_IPC_LOCK;";
            return bad;
        }
        if (st.err().code != EPERM) {
            bad += "require code not EPERM;";
        }
        return bad.empty() ? "MSG:" + st.err().message : bad;
    });
    ASSERT_EQ(r.exit_code, 0);
    ASSERT_EQ(r.reply.rfind("MSG:", 0), 0u) << r.reply;
    const std::string msg = r.reply.substr(4);
    EXPECT_NE(msg.find("dispatch thread setup needs CAP_IPC_LOCK and CAP_BPF, which this process lacks"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("CAP_SYS_NICE,"), std::string::npos) << msg;
}

TEST(capabilities, drop_refuses_to_keep_a_capability_that_is_not_permitted_and_changes_nothing) {
    if (!root_with_setpcap()) {
        GTEST_SKIP() << "needs root with CAP_SETPCAP to drop capabilities in a child";
    }
    const auto r = run_in_child([]() -> std::string {
        rtcore::drop_options keep_setpcap;
        keep_setpcap.set_no_new_privs = false;
        auto first = rtcore::drop_capabilities_except({CAP_SYS_NICE, CAP_SETPCAP}, keep_setpcap);
        if (!first) {
            return "first drop failed: " + first.err().message;
        }
        auto second = rtcore::drop_capabilities_except({CAP_SYS_NICE, CAP_SYS_ADMIN});
        if (second) {
            return "second drop kept CAP_SYS_ADMIN it did not have";
        }
        std::string bad;
        if (!rtcore::has_capability(CAP_SETPCAP) || cap_get_bound(CAP_SYS_ADMIN) != 0 ||
            ::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 0) {
            bad += "state changed by a refused drop;";
        }
        return bad.empty() ? "MSG:" + second.err().message : bad;
    });
    ASSERT_EQ(r.reply.rfind("MSG:", 0), 0u) << r.reply;
    EXPECT_NE(r.reply.find("drop capabilities: cannot keep CAP_SYS_ADMIN: not in the permitted set"),
              std::string::npos)
        << r.reply;
}

TEST(capabilities, without_setpcap_the_bounding_set_is_left_and_the_report_says_why) {
    if (!root_with_setpcap()) {
        GTEST_SKIP() << "needs root with CAP_SETPCAP to drop capabilities in a child";
    }
    const auto r = run_in_child([]() -> std::string {
        rtcore::drop_options no_bound;
        no_bound.drop_bounding_set = false;
        no_bound.set_no_new_privs = false;
        if (auto first = rtcore::drop_capabilities_except({CAP_SYS_NICE}, no_bound); !first) {
            return "first drop failed: " + first.err().message;
        }
        auto second = rtcore::drop_capabilities_except({CAP_SYS_NICE});
        if (!second) {
            return "second drop failed: " + second.err().message;
        }
        if (second->bounding_set_dropped || second->notes.empty()) {
            return "no note about the bounding set";
        }
        if (cap_get_bound(CAP_NET_ADMIN) != 1) {
            return "bounding set changed without CAP_SETPCAP";
        }
        return "NOTE:" + second->notes.front();
    });
    EXPECT_EQ(r.reply, "NOTE:bounding set left as is: CAP_SETPCAP is not effective");
}
