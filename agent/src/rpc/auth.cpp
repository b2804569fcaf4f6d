#include "qrt/rpc/auth.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include <fmt/format.h>

namespace qrt::rpc {

std::optional<role> role_from_name(std::string_view name) noexcept {
    const auto r = proto::role_from_name(name);
    return r && *r != role::none ? r : std::nullopt;
}

std::vector<std::string> role_set::names() const {
    std::vector<std::string> out;
    for (const role r : {role::reader, role::scheduler, role::calibration, role::admin}) {
        if (holds(r)) {
            out.emplace_back(role_name(r));
        }
    }
    return out;
}

rtcore::result<principal> principal::parse(std::string_view text) {
    const auto colon = text.find(':');
    if (colon == std::string_view::npos) {
        return rtcore::error::invalid(
            fmt::format("role principal '{}': expected user:NAME, group:NAME, uid:N or gid:N", text));
    }
    const std::string_view prefix = text.substr(0, colon);
    const std::string_view rest = text.substr(colon + 1);
    principal p;
    if (prefix == "user" || prefix == "group") {
        if (rest.empty() || rest.find_first_of(" \t\n:") != std::string_view::npos) {
            return rtcore::error::invalid(
                fmt::format("role principal '{}': name must be non-empty without spaces or ':'", text));
        }
        p.what = prefix == "user" ? kind::user : kind::group;
        p.name = std::string(rest);
        return p;
    }
    if (prefix == "uid" || prefix == "gid") {
        std::uint32_t n = 0;
        const auto* first = rest.data();
        const auto* last = rest.data() + rest.size();
        const auto [ptr, ec] = std::from_chars(first, last, n);
        if (rest.empty() || ec != std::errc{} || ptr != last) {
            return rtcore::error::invalid(
                fmt::format("role principal '{}': '{}' is not a decimal id in [0, 4294967295]", text,
                            rest));
        }
        p.what = prefix == "uid" ? kind::uid : kind::gid;
        p.id = n;
        return p;
    }
    return rtcore::error::invalid(fmt::format(
        "role principal '{}': unknown kind '{}' (expected user, group, uid or gid)", text, prefix));
}

std::string principal::to_string() const {
    switch (what) {
        case kind::user:
            return "user:" + name;
        case kind::group:
            return "group:" + name;
        case kind::uid:
            return fmt::format("uid:{}", id);
        case kind::gid:
            return fmt::format("gid:{}", id);
    }
    return {};
}

std::string peer_identity::tenant() const {
    return user_name.empty() ? fmt::format("uid:{}", uid) : user_name;
}

bool peer_identity::in_group(gid_t g) const {
    return gid == g || std::find(groups.begin(), groups.end(), g) != groups.end();
}

namespace {

std::vector<char> pw_buffer() {
    long n = ::sysconf(_SC_GETPW_R_SIZE_MAX);
    return std::vector<char>(n > 0 ? static_cast<std::size_t>(n) : 16384U);
}

// The user name of uid (nullopt: no passwd entry), or the error NSS gave.
struct name_lookup {
    std::optional<std::string> name;
    int error = 0;
};

name_lookup user_name_of(uid_t uid, getpwuid_r_fn getpwuid) {
    auto buf = pw_buffer();
    passwd pw{};
    passwd* out = nullptr;
    while (true) {
        const int rc = getpwuid(uid, &pw, buf.data(), buf.size(), &out);
        if (rc == ERANGE && buf.size() < (1U << 20)) {
            buf.resize(buf.size() * 2);
            continue;
        }
        // getpwuid_r(3): 0 with a null result is "no entry"; so, by
        // POSIX, are ENOENT, ESRCH, EBADF and EPERM, which some NSS
        // modules return for it.  Anything else is NSS failing, not an
        // answer about the user.
        if (rc == 0 || rc == ENOENT || rc == ESRCH || rc == EBADF || rc == EPERM) {
            if (rc != 0 || out == nullptr) {
                return {};
            }
            return {std::string(pw.pw_name), 0};
        }
        return {std::nullopt, rc};
    }
}

int system_getpwuid_r(uid_t uid, passwd* pw, char* buf, std::size_t len, passwd** out) {
    return ::getpwuid_r(uid, pw, buf, len, out);
}

// nss_cache's default lookup: a failure throws, so it is not cached.
std::optional<std::string> user_name_or_throw(uid_t uid) {
    auto r = user_name_of(uid, system_getpwuid_r);
    if (r.error != 0) {
        throw std::system_error(r.error, std::generic_category(),
                                fmt::format("getpwuid_r uid {}", uid));
    }
    return r.name;
}

std::optional<gid_t> gid_of_group(const std::string& name) {
    long n = ::sysconf(_SC_GETGR_R_SIZE_MAX);
    std::vector<char> buf(n > 0 ? static_cast<std::size_t>(n) : 16384U);
    group gr{};
    group* out = nullptr;
    while (true) {
        const int rc = ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &out);
        if (rc == ERANGE && buf.size() < (1U << 20)) {
            buf.resize(buf.size() * 2);
            continue;
        }
        if (rc != 0 || out == nullptr) {
            return std::nullopt;
        }
        return gr.gr_gid;
    }
}

}  // namespace

nss_cache::nss_cache(options o, lookup user_name)
    : _opts(o), _lookup(user_name ? std::move(user_name) : lookup(user_name_or_throw)) {
    _opts.capacity = std::max<std::size_t>(1, _opts.capacity);
}

const nss_answer* nss_cache::find(uid_t uid, std::int64_t now_ns, bool want_groups) const {
    const auto it = _entries.find(uid);
    if (it == _entries.end() || now_ns - it->second.looked_up_ns >= _opts.ttl_ns ||
        now_ns < it->second.looked_up_ns) {
        return nullptr;
    }
    // A name without groups does not answer a query that needs them (a
    // user with no passwd entry has no groups to look up either).
    if (want_groups && it->second.answer.user_name && !it->second.answer.groups) {
        return nullptr;
    }
    return &it->second.answer;
}

void nss_cache::store(uid_t uid, const nss_answer& a, std::int64_t now_ns) {
    if (_entries.size() >= _opts.capacity && _entries.count(uid) == 0) {
        const auto oldest = std::min_element(_entries.begin(), _entries.end(), [](const auto& x, const auto& y) {
            return x.second.looked_up_ns < y.second.looked_up_ns;
        });
        _entries.erase(oldest);
    }
    _entries[uid] = entry{a, now_ns};
}

std::optional<std::string> nss_cache::user_name(uid_t uid, std::int64_t now_ns) {
    if (const nss_answer* a = find(uid, now_ns, false)) {
        return a->user_name;
    }
    ++_lookups;
    nss_answer a;
    a.user_name = _lookup(uid);
    store(uid, a, now_ns);
    return a.user_name;
}

namespace {

std::optional<std::vector<gid_t>> group_list_of(const std::string& user, gid_t gid) {
    int ngroups = 64;
    std::vector<gid_t> groups(static_cast<std::size_t>(ngroups));
    for (int attempt = 0; attempt < 4; ++attempt) {
        int n = ngroups;
        if (::getgrouplist(user.c_str(), gid, groups.data(), &n) >= 0) {
            groups.resize(static_cast<std::size_t>(n));
            return groups;
        }
        ngroups = n > ngroups ? n : ngroups * 2;
        groups.resize(static_cast<std::size_t>(ngroups));
    }
    return std::nullopt;
}

}  // namespace

nss_answer nss_lookup_with(const nss_query& q, getpwuid_r_fn getpwuid) {
    nss_answer a;
    auto r = user_name_of(q.uid, getpwuid);
    a.user_name = std::move(r.name);
    a.error = r.error;
    if (q.want_groups && a.user_name) {
        a.groups = group_list_of(*a.user_name, q.gid);
    }
    return a;
}

nss_answer nss_lookup_system(const nss_query& q) { return nss_lookup_with(q, system_getpwuid_r); }

void apply_nss_answer(peer_identity& id, const nss_answer& a) {
    if (a.user_name) {
        id.user_name = *a.user_name;
    }
    if (id.groups_source.empty() && a.groups) {
        id.groups = *a.groups;
        id.groups_source = "getgrouplist";
    }
    if (std::find(id.groups.begin(), id.groups.end(), id.gid) == id.groups.end()) {
        id.groups.push_back(id.gid);
    }
}

rtcore::result<peer_identity> peer_credentials_of(int fd) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
        const int err = errno;
        return rtcore::error::from_errno(err, fmt::format("getsockopt fd {} SO_PEERCRED", fd));
    }
    peer_identity id;
    id.uid = cred.uid;
    id.gid = cred.gid;
    id.pid = cred.pid;
#ifdef SO_PEERGROUPS
    {
        std::vector<gid_t> groups(64);
        for (int attempt = 0; attempt < 4; ++attempt) {
            socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
            if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) == 0) {
                groups.resize(glen / sizeof(gid_t));
                id.groups = std::move(groups);
                id.groups_source = "SO_PEERGROUPS";
                break;
            }
            if (errno != ERANGE) {
                break;
            }
            groups.resize(glen / sizeof(gid_t) + 16);
        }
    }
#endif
    if (std::find(id.groups.begin(), id.groups.end(), id.gid) == id.groups.end()) {
        id.groups.push_back(id.gid);
    }
    return id;
}

rtcore::result<peer_identity> peer_identity_of(int fd, nss_cache* names, std::int64_t now_ns) {
    auto id = peer_credentials_of(fd);
    if (!id) {
        return id;
    }
    nss_answer a;
    try {
        a.user_name = names != nullptr ? names->user_name(id->uid, now_ns) : user_name_or_throw(id->uid);
    } catch (const std::system_error& e) {
        return rtcore::error{EAGAIN, fmt::format("user lookup (NSS) for uid {} failed: {}", id->uid,
                                                 e.what())};
    }
    if (id->groups_source.empty() && a.user_name) {
        a.groups = group_list_of(*a.user_name, id->gid);
    }
    apply_nss_answer(*id, a);
    return id;
}

// ------------------------------------------------------------ nss_resolver

struct nss_resolver::shared {
    options opts;
    nss_lookup lookup;
    answer_fn on_answer;
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<nss_query> queue;
    std::optional<uid_t> busy;  // the uid being looked up now
    bool stop = false;
    bool exited = false;
    std::condition_variable exited_cv;
    std::uint64_t lookups = 0;
};

nss_resolver::nss_resolver(options o, nss_lookup lookup, answer_fn on_answer)
    : _s(std::make_shared<shared>()) {
    _s->opts = o;
    _s->opts.queue_capacity = std::max<std::size_t>(1, o.queue_capacity);
    _s->lookup = lookup ? std::move(lookup) : nss_lookup(nss_lookup_system);
    _s->on_answer = std::move(on_answer);
    // The thread owns a reference to the state: if destruction gives up on
    // a lookup stuck in NSS, the thread still has everything it touches.
    std::thread([s = _s] {
        ::pthread_setname_np(::pthread_self(), "qrtd-nss");
        std::unique_lock<std::mutex> lock(s->mu);
        while (true) {
            s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
            if (s->stop) {
                break;
            }
            const nss_query q = s->queue.front();
            s->queue.pop_front();
            s->busy = q.uid;
            ++s->lookups;
            lock.unlock();
            nss_answer a;
            try {
                a = s->lookup(q);
            } catch (...) {
                // A lookup that throws is NSS failing, not "no entry": the
                // peer is told so and nothing is cached.
                a = nss_answer{};
                a.error = EIO;
            }
            lock.lock();
            s->busy.reset();
            if (s->stop) {
                break;
            }
            // Under the lock: after the destructor has set stop, no answer
            // is delivered to an owner that has gone.
            s->on_answer(q, std::move(a));
        }
        s->exited = true;
        s->exited_cv.notify_all();
    }).detach();
}

nss_resolver::~nss_resolver() {
    std::unique_lock<std::mutex> lock(_s->mu);
    _s->stop = true;
    _s->queue.clear();
    _s->cv.notify_all();
    // A lookup stuck in NSS is not waited for past stop_wait; the thread
    // then exits when (if) it returns, touching only the shared state.
    _s->exited_cv.wait_for(lock, _s->opts.stop_wait, [&] { return _s->exited; });
}

nss_resolver::submitted nss_resolver::submit(const nss_query& q) {
    const std::lock_guard<std::mutex> lock(_s->mu);
    if (_s->busy == q.uid) {
        // The lookup under way may lack the groups this query needs: queue
        // it again only then.
        if (!q.want_groups) {
            return submitted::joined;
        }
    }
    for (auto& w : _s->queue) {
        if (w.uid == q.uid) {
            w.want_groups = w.want_groups || q.want_groups;
            return submitted::joined;
        }
    }
    if (_s->queue.size() >= _s->opts.queue_capacity) {
        return submitted::full;
    }
    _s->queue.push_back(q);
    _s->cv.notify_one();
    return submitted::queued;
}

std::size_t nss_resolver::pending() const {
    const std::lock_guard<std::mutex> lock(_s->mu);
    return _s->queue.size() + (_s->busy ? 1U : 0U);
}

std::uint64_t nss_resolver::lookups() const {
    const std::lock_guard<std::mutex> lock(_s->mu);
    return _s->lookups;
}

rtcore::result<principal> resolve_principal(std::string_view text) {
    auto p = principal::parse(text);
    if (!p) {
        return std::move(p).err();
    }
    if (p->what == principal::kind::group) {
        auto g = gid_of_group(p->name);
        if (!g) {
            return rtcore::error::invalid(
                fmt::format("group '{}' does not exist (getgrnam_r)", p->name));
        }
        p->id = *g;
    }
    return p;
}

bool principal_matches(const principal& who, const peer_identity& peer) noexcept {
    switch (who.what) {
        case principal::kind::user:
            return !peer.user_name.empty() && peer.user_name == who.name;
        case principal::kind::uid:
            return peer.uid == who.id;
        case principal::kind::group:
        case principal::kind::gid:
            return peer.in_group(who.id);
    }
    return false;
}

rtcore::result<authorizer> authorizer::compile(const role_map& map) {
    authorizer a;
    const std::pair<role, const std::vector<std::string>*> lists[] = {
        {role::reader, &map.reader},
        {role::scheduler, &map.scheduler},
        {role::calibration, &map.calibration},
        {role::admin, &map.admin},
    };
    for (const auto& [r, list] : lists) {
        for (const auto& text : *list) {
            auto p = resolve_principal(text);
            if (!p) {
                return rtcore::error::invalid(
                    fmt::format("roles.{}: {}", role_name(r), p.err().message));
            }
            a._grants.push_back(grant{std::move(*p), r});
        }
    }
    return a;
}

role_set authorizer::roles_of(const peer_identity& peer) const {
    role_set out;
    for (const auto& g : _grants) {
        if (principal_matches(g.who, peer)) {
            out = out.with(g.what);
        }
    }
    return out;
}

}  // namespace qrt::rpc
