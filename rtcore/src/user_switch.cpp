// Switching to an unprivileged user with a few capabilities: see user_switch.hpp.

#include "rtcore/user_switch.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <type_traits>

namespace rtcore {

namespace {

struct cap_deleter {
    void operator()(void* p) const noexcept { cap_free(p); }
};
using cap_ptr = std::unique_ptr<std::remove_pointer_t<cap_t>, cap_deleter>;

std::string group_name(gid_t gid) {
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    if (::getgrgid_r(gid, &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
        return found->gr_name;
    }
    return std::to_string(gid);
}

bool is_kept(const std::vector<capability>& keep, capability c) {
    return std::find(keep.begin(), keep.end(), c) != keep.end();
}

}  // namespace

result<user_ids> lookup_user(const std::string& user, const std::string& group_wanted) {
    user_ids out;
    out.user = user;
    passwd pw{};
    passwd* pfound = nullptr;
    std::vector<char> buf(16384);
    const int prc = ::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &pfound);
    if (prc != 0) {
        return error::from_errno(prc, "getpwnam_r(\"" + user + "\")");
    }
    if (pfound == nullptr) {
        return error{ENOENT, "user \"" + user + "\" does not exist"};
    }
    out.uid = pfound->pw_uid;
    out.gid = pfound->pw_gid;
    if (!group_wanted.empty()) {
        group gr{};
        group* gfound = nullptr;
        std::vector<char> gbuf(16384);
        const int grc = ::getgrnam_r(group_wanted.c_str(), &gr, gbuf.data(), gbuf.size(), &gfound);
        if (grc != 0) {
            return error::from_errno(grc, "getgrnam_r(\"" + group_wanted + "\")");
        }
        if (gfound == nullptr) {
            return error{ENOENT, "group \"" + group_wanted + "\" does not exist"};
        }
        out.gid = gfound->gr_gid;
        out.group = group_wanted;
    } else {
        out.group = group_name(out.gid);
    }
    int n = 16;
    std::vector<gid_t> groups(static_cast<std::size_t>(n));
    while (::getgrouplist(user.c_str(), out.gid, groups.data(), &n) < 0) {
        if (n <= static_cast<int>(groups.size()) || n > 65536) {
            return error{EINVAL, "getgrouplist(\"" + user + "\") failed"};
        }
        groups.resize(static_cast<std::size_t>(n));
    }
    groups.resize(static_cast<std::size_t>(n));
    if (std::find(groups.begin(), groups.end(), out.gid) == groups.end()) {
        groups.push_back(out.gid);
    }
    out.groups = std::move(groups);
    return out;
}

result<switch_report> switch_user(const user_ids& to, const std::vector<capability>& keep) {
    if (const auto n = thread_count(); n > 1) {
        return error{EBUSY, "switch to user " + to.user + ": " + std::to_string(n) +
                                " threads are running; capabilities are per thread, so the switch must happen "
                                "before any thread starts"};
    }
    const capability max_bits = cap_max_bits();
    // 1. The bounding set, while CAP_SETPCAP is still effective.
    if (!has_capability(CAP_SETPCAP)) {
        return error{EPERM, "switch to user " + to.user + ": CAP_SETPCAP is not effective, so the bounding set "
                                                          "cannot be reduced (capabilities: \"" +
                                current_capabilities_text() + "\")"};
    }
    for (capability c = 0; c < max_bits; ++c) {
        if (!is_kept(keep, c) && cap_get_bound(c) == 1 && cap_drop_bound(c) != 0) {
            const int err = errno;
            return error::from_errno(err, "cap_drop_bound(" + capability_name(c) + ")");
        }
    }
    // 2 + 3. Keep the permitted set across the uid change, then change ids.
    if (::prctl(PR_SET_KEEPCAPS, 1L, 0L, 0L, 0L) != 0) {
        const int err = errno;
        return error::from_errno(err, "prctl(PR_SET_KEEPCAPS, 1)");
    }
    if (::setgroups(to.groups.size(), to.groups.data()) != 0) {
        const int err = errno;
        return error::from_errno(err, "setgroups (" + std::to_string(to.groups.size()) + " groups of " + to.user + ")");
    }
    if (::setresgid(to.gid, to.gid, to.gid) != 0) {
        const int err = errno;
        return error::from_errno(err, "setresgid(" + std::to_string(to.gid) + ")");
    }
    if (::setresuid(to.uid, to.uid, to.uid) != 0) {
        const int err = errno;
        return error::from_errno(err, "setresuid(" + std::to_string(to.uid) + ")");
    }
    // 4. Exactly the kept capabilities.
    drop_options opts;
    opts.drop_bounding_set = false;  // done above, while it was possible
    opts.keep_inheritable = false;
    opts.set_no_new_privs = true;
    auto dropped = drop_capabilities_except(keep, opts);
    if (!dropped) {
        return error{dropped.err().code, "switch to user " + to.user + ": " + dropped.err().message};
    }
    if (::prctl(PR_SET_KEEPCAPS, 0L, 0L, 0L, 0L) != 0) {
        const int err = errno;
        return error::from_errno(err, "prctl(PR_SET_KEEPCAPS, 0)");
    }
    dropped->bounding_set_dropped = true;
    dropped->notes.erase(std::remove_if(dropped->notes.begin(), dropped->notes.end(),
                                        [](const std::string& n) { return n.rfind("bounding set", 0) == 0; }),
                         dropped->notes.end());
    // 5. Check what the kernel says now.
    uid_t r = 0;
    uid_t e = 0;
    uid_t s = 0;
    gid_t rg = 0;
    gid_t eg = 0;
    gid_t sg = 0;
    if (::getresuid(&r, &e, &s) != 0 || r != to.uid || e != to.uid || s != to.uid || ::getresgid(&rg, &eg, &sg) != 0 ||
        rg != to.gid || eg != to.gid || sg != to.gid) {
        return error{EPERM, "switch to user " + to.user + ": the ids did not all change"};
    }
    if (to.uid != 0 && ::setuid(0) == 0) {
        return error{EPERM, "switch to user " + to.user + ": setuid(0) still succeeds"};
    }
    const cap_ptr now(cap_get_proc());
    if (!now) {
        const int err = errno;
        return error::from_errno(err, "cap_get_proc");
    }
    for (capability c = 0; c < max_bits; ++c) {
        cap_flag_value_t eff = CAP_CLEAR;
        cap_flag_value_t perm = CAP_CLEAR;
        cap_get_flag(now.get(), c, CAP_EFFECTIVE, &eff);
        cap_get_flag(now.get(), c, CAP_PERMITTED, &perm);
        const bool want = is_kept(keep, c);
        if ((eff == CAP_SET) != want || (perm == CAP_SET) != want) {
            return error{EPERM, "switch to user " + to.user + ": " + capability_name(c) + " is " +
                                    (want ? "missing" : "still there") + " (capabilities: \"" +
                                    current_capabilities_text() + "\")"};
        }
    }
    switch_report rep;
    rep.caps = std::move(*dropped);
    rep.ids = "uid " + std::to_string(to.uid) + " (" + to.user + "), gid " + std::to_string(to.gid) + " (" +
              to.group + "), groups";
    for (gid_t g : to.groups) {
        rep.ids += " " + std::to_string(g);
    }
    return rep;
}

}  // namespace rtcore
