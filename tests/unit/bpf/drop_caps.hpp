#pragma once
// The capability set of a test child (run it with qrt::testing::run_in_child,
// qrt_test/process.hpp), so that capability tests never change the test
// process itself.

#include <sys/capability.h>
#include <initializer_list>
#include <vector>

#include "qrt_test/process.hpp"

namespace qrt_bpf_test {

// Keeps exactly `keep` in the effective and permitted sets (inheritable
// cleared).  Returns false when cap_set_proc fails.
inline bool drop_caps_except(std::initializer_list<cap_value_t> keep) {
    cap_t caps = cap_init();
    if (caps == nullptr) {
        return false;
    }
    std::vector<cap_value_t> list(keep);
    bool ok = true;
    if (!list.empty()) {
        ok = cap_set_flag(caps, CAP_EFFECTIVE, static_cast<int>(list.size()), list.data(), CAP_SET) == 0 &&
             cap_set_flag(caps, CAP_PERMITTED, static_cast<int>(list.size()), list.data(), CAP_SET) == 0;
    }
    ok = ok && cap_set_proc(caps) == 0;
    cap_free(caps);
    return ok;
}

}  // namespace qrt_bpf_test
