#include "rtcore/capabilities.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>

namespace rtcore {

namespace {

struct cap_deleter {
    void operator()(void* p) const noexcept { cap_free(p); }
};
using cap_ptr = std::unique_ptr<std::remove_pointer_t<cap_t>, cap_deleter>;

bool flag_set(cap_t caps, capability cap, cap_flag_t which) noexcept {
    cap_flag_value_t v = CAP_CLEAR;
    if (cap_get_flag(caps, cap, which, &v) != 0) {
        return false;
    }
    return v == CAP_SET;
}

bool has_in(capability cap, cap_flag_t which) noexcept {
    if (cap < 0 || cap >= cap_max_bits()) {
        return false;
    }
    const cap_ptr caps(cap_get_proc());
    if (!caps) {
        return false;
    }
    return flag_set(caps.get(), cap, which);
}

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i > 0) {
            out += (i + 1 == names.size()) ? " and " : ", ";
        }
        out += names[i];
    }
    return out;
}

}  // namespace

std::size_t thread_count() {
    std::error_code ec;
    std::size_t n = 0;
    for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) {
        ++n;
    }
    return n;
}

std::string capability_name(capability cap) {
    if (cap >= 0) {
        char* raw = cap_to_name(cap);
        if (raw != nullptr) {
            std::string name(raw);
            cap_free(raw);
            // libcap spells numbers it does not know as plain digits.
            if (!name.empty() && std::isdigit(static_cast<unsigned char>(name.front())) == 0) {
                std::transform(name.begin(), name.end(), name.begin(),
                               [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
                return name;
            }
        }
    }
    return "CAP_" + std::to_string(cap);
}

result<capability> capability_from_name(std::string_view name) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower.rfind("cap_", 0) != 0) {
        lower = "cap_" + lower;
    }
    cap_value_t v = 0;
    if (cap_from_name(lower.c_str(), &v) != 0) {
        return error::invalid("unknown capability \"" + std::string(name) + "\"");
    }
    return v;
}

bool has_capability(capability cap) noexcept { return has_in(cap, CAP_EFFECTIVE); }

bool has_permitted_capability(capability cap) noexcept { return has_in(cap, CAP_PERMITTED); }

std::string current_capabilities_text() {
    const cap_ptr caps(cap_get_proc());
    if (!caps) {
        return "(cap_get_proc failed)";
    }
    char* text = cap_to_text(caps.get(), nullptr);
    if (text == nullptr) {
        return "(cap_to_text failed)";
    }
    std::string out(text);
    cap_free(text);
    return out.empty() ? "=" : out;
}

status require_capabilities(const std::vector<capability>& caps, std::string_view what) {
    std::vector<std::string> missing;
    for (const capability c : caps) {
        if (!has_capability(c)) {
            missing.push_back(capability_name(c));
        }
    }
    if (missing.empty()) {
        return ok();
    }
    std::string msg = std::string(what) + " needs " + join(missing) + ", which this process lacks";
    msg += " (capabilities: \"" + current_capabilities_text() + "\"";
    msg += "; run as root, or grant with AmbientCapabilities= in the unit)";
    return error{EPERM, msg};
}

result<drop_report> drop_capabilities_except(const std::vector<capability>& keep, drop_options opts) {
    const cap_ptr now(cap_get_proc());
    if (!now) {
        const int err = errno;
        return error::from_errno(err, "cap_get_proc");
    }
    const capability max_bits = cap_max_bits();

    // Refuse before changing anything if something to keep is not permitted.
    std::vector<std::string> not_permitted;
    for (const capability c : keep) {
        if (c < 0 || c >= max_bits || !flag_set(now.get(), c, CAP_PERMITTED)) {
            not_permitted.push_back(capability_name(c));
        }
    }
    if (!not_permitted.empty()) {
        return error{EPERM, "drop capabilities: cannot keep " + join(not_permitted) +
                                ": not in the permitted set (capabilities: \"" + current_capabilities_text() +
                                "\")"};
    }

    const auto is_kept = [&](capability c) { return std::find(keep.begin(), keep.end(), c) != keep.end(); };
    drop_report report;
    for (capability c = 0; c < max_bits; ++c) {
        if (is_kept(c)) {
            report.kept.push_back(capability_name(c));
        } else if (flag_set(now.get(), c, CAP_PERMITTED)) {
            report.dropped.push_back(capability_name(c));
        }
    }

    // The bounding set first: removing from it needs CAP_SETPCAP, which the
    // next step takes away.
    if (opts.drop_bounding_set) {
        if (flag_set(now.get(), CAP_SETPCAP, CAP_EFFECTIVE)) {
            for (capability c = 0; c < max_bits; ++c) {
                if (is_kept(c) || cap_get_bound(c) != 1) {
                    continue;
                }
                if (cap_drop_bound(c) != 0) {
                    const int err = errno;
                    return error::from_errno(err, "cap_drop_bound(" + capability_name(c) + ")");
                }
            }
            report.bounding_set_dropped = true;
        } else {
            report.notes.push_back("bounding set left as is: CAP_SETPCAP is not effective");
        }
    }

    const cap_ptr next(cap_init());
    if (!next) {
        const int err = errno;
        return error::from_errno(err, "cap_init");
    }
    if (!keep.empty()) {
        const auto n = static_cast<int>(keep.size());
        if (cap_set_flag(next.get(), CAP_EFFECTIVE, n, keep.data(), CAP_SET) != 0 ||
            cap_set_flag(next.get(), CAP_PERMITTED, n, keep.data(), CAP_SET) != 0) {
            const int err = errno;
            return error::from_errno(err, "cap_set_flag");
        }
        if (opts.keep_inheritable && cap_set_flag(next.get(), CAP_INHERITABLE, n, keep.data(), CAP_SET) != 0) {
            const int err = errno;
            return error::from_errno(err, "cap_set_flag(CAP_INHERITABLE)");
        }
    }
    if (cap_set_proc(next.get()) != 0) {
        const int err = errno;
        return error::from_errno(err, "cap_set_proc(" + [&] {
            char* t = cap_to_text(next.get(), nullptr);
            std::string s = t != nullptr ? t : "?";
            cap_free(t);
            return s;
        }() + ")");
    }
    // Ambient caps survive execve of unprivileged binaries; none are wanted.
    if (cap_reset_ambient() != 0) {
        const int err = errno;
        report.notes.push_back("ambient set not reset: " + error::from_errno(err, "cap_reset_ambient").message);
    }

    if (opts.set_no_new_privs) {
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L) != 0) {
            const int err = errno;
            return error::from_errno(err, "prctl(PR_SET_NO_NEW_PRIVS, 1)");
        }
        report.no_new_privs = true;
    }

    if (const std::size_t threads = thread_count(); threads > 1) {
        report.notes.push_back("dropped for the calling thread only: " + std::to_string(threads - 1) +
                               " other thread(s) already running keep their capabilities");
    }
    return report;
}

}  // namespace rtcore
