#pragma once
// Dropping root for good: switch to an unprivileged user and keep exactly
// the capabilities asked for.
//
//   auto who = rtcore::lookup_user("qrtd", "qrt");   // names -> ids, with the fix when missing
//   // ... everything that needs root (apply, fork the root helper, bind the socket) ...
//   auto dropped = rtcore::switch_user(*who, {CAP_SYS_NICE, CAP_IPC_LOCK, CAP_BPF, CAP_PERFMON});
//
// switch_user, in this order (capability sets are per thread: call it while
// the process has one thread, which it checks):
//   1. the bounding set loses every capability not kept (needs CAP_SETPCAP,
//      so before the uid changes);
//   2. PR_SET_KEEPCAPS, so the permitted set survives the uid change;
//   3. setgroups (the user's supplementary groups), setresgid, setresuid:
//      real, effective and saved ids all become the user's;
//   4. effective = permitted = the kept capabilities, inheritable and
//      ambient empty, PR_SET_KEEPCAPS off, PR_SET_NO_NEW_PRIVS on;
//   5. checks: every id is the user's, setuid(0) fails, and the effective
//      and permitted sets are exactly the kept ones.
// Any failure is an error naming the step; the process must then exit (it
// may be half-way between root and the user).

#include <sys/capability.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "rtcore/capabilities.hpp"
#include "rtcore/error.hpp"

namespace rtcore {

struct user_ids {
    std::string user;
    std::string group;
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;  // supplementary groups (getgrouplist), gid included
};

// Resolves user and group names (group "" = the user's primary group).  An
// unknown name is an error (ENOENT) that says so; the caller adds the fix.
result<user_ids> lookup_user(const std::string& user, const std::string& group);

struct switch_report {
    drop_report caps;
    std::string ids;  // "uid 998 (qrtd), gid 997 (qrt), groups 997"
};

result<switch_report> switch_user(const user_ids& to, const std::vector<capability>& keep);

}  // namespace rtcore
