#pragma once
// Linux capabilities through libcap: check what this process may do, say
// plainly what is missing, and drop what the daemon no longer needs.
//
//   if (auto st = rtcore::require_capabilities({CAP_SYS_NICE, CAP_IPC_LOCK},
//                                              "dispatch thread setup"); !st) {
//       // st.err().message: "dispatch thread setup needs CAP_SYS_NICE, which
//       //  this process lacks (effective: cap_ipc_lock,cap_bpf=ep ...)"
//   }
//   // qrtd run, after applying the partition (needs root) and before
//   // starting any thread (capability sets are per thread in Linux; threads
//   // created later inherit the caller's):
//   auto dropped = rtcore::drop_capabilities_except(
//       {CAP_SYS_NICE, CAP_IPC_LOCK, CAP_BPF, CAP_PERFMON});
//
// Capability numbers are the kernel's CAP_* constants.

#include <sys/capability.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "rtcore/error.hpp"

namespace rtcore {

using capability = cap_value_t;

// "CAP_SYS_NICE"; "CAP_<n>" for numbers libcap has no name for.
std::string capability_name(capability cap);
// The inverse, case-insensitive, with or without the "CAP_" prefix.
result<capability> capability_from_name(std::string_view name);

// Is cap in this thread's effective set?
bool has_capability(capability cap) noexcept;
// Is cap in this thread's permitted set (could be raised into effective)?
bool has_permitted_capability(capability cap) noexcept;

// ok() when every cap is effective; otherwise an error (EPERM) naming each
// missing capability and `what` needs it.
status require_capabilities(const std::vector<capability>& caps, std::string_view what);

// The current sets in libcap text form ("cap_sys_nice,cap_ipc_lock=ep").
std::string current_capabilities_text();

// Threads of this process (/proc/self/task): capability sets and user ids
// are per thread, so dropping them is checked to happen while there is one.
std::size_t thread_count();

struct drop_options {
    // Also remove the dropped caps from the bounding set (needs CAP_SETPCAP;
    // skipped and reported when it is not effective).
    bool drop_bounding_set = true;
    // Keep the kept caps in the inheritable set as well (for exec'ing
    // helpers that should have them); off by default.
    bool keep_inheritable = false;
    // prctl(PR_SET_NO_NEW_PRIVS): no later execve can gain privileges.
    bool set_no_new_privs = true;
};

struct drop_report {
    std::vector<std::string> kept;      // names of the caps left effective + permitted
    std::vector<std::string> dropped;   // names of the caps that were permitted and are gone
    bool bounding_set_dropped = false;
    bool no_new_privs = false;
    std::vector<std::string> notes;     // e.g. why the bounding set was left alone
};

// Drop every capability except `keep` from the effective, permitted,
// inheritable (unless keep_inheritable) and ambient sets, and where allowed
// from the bounding set.  Fails (and changes nothing) when a cap to keep is
// not permitted now.  Applies to the calling thread, and to threads it
// creates afterwards: call it before starting threads.
result<drop_report> drop_capabilities_except(const std::vector<capability>& keep, drop_options opts = {});

}  // namespace rtcore
