#pragma once
// Authorization for the control socket.
//
// Who: the kernel tells us (SO_PEERCRED: uid, gid, pid; SO_PEERGROUPS: the
// supplementary groups the peer held when it connected; getgrouplist() on the
// uid's passwd entry is the fallback for kernels before 4.13).
// What: roles, granted by a role_map of principals ("user:NAME",
// "group:NAME", "uid:N", "gid:N"), translated by the daemon from [roles] in
// qrtd.toml.
//
// Role semantics:
//   reader       queries (agent.status, qpus.list, calibration.get,
//                slots.query, jobs.status of its OWN jobs, telemetry.*,
//                metrics, events.*)
//   scheduler    reader + reserve/heartbeat/release, submit/cancel/result,
//                on its OWN objects only
//   calibration  reader + calibration.update
//   admin        everything, on every tenant's objects
//   (agent.hello needs no role: a peer can always learn what it may do.)
// The tenant of a connection is its user name (or "uid:N" when the uid has
// no passwd entry).

#include <pwd.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/proto/protocol.hpp"
#include "rtcore/error.hpp"

namespace qrt::rpc {

// The roles a peer may hold (the protocol's table: qrt/proto/protocol.hpp).
using role = proto::role;
using proto::role_name;
// A role a peer can be given in [roles] (none is no role).
std::optional<role> role_from_name(std::string_view name) noexcept;

// The set of roles one peer holds.
class role_set {
public:
    constexpr role_set() = default;
    constexpr explicit role_set(std::uint8_t bits) : _bits(bits) {}
    constexpr role_set with(role r) const { return role_set(static_cast<std::uint8_t>(_bits | static_cast<std::uint8_t>(r))); }
    constexpr bool holds(role r) const { return (_bits & static_cast<std::uint8_t>(r)) != 0; }
    // May a holder of this set call a method that requires `required`?
    constexpr bool allows(role required) const {
        if (required == role::none || holds(role::admin)) {
            return true;
        }
        if (required == role::reader) {
            return holds(role::reader) || holds(role::scheduler) || holds(role::calibration);
        }
        return holds(required);
    }
    constexpr bool empty() const { return _bits == 0; }
    constexpr std::uint8_t bits() const { return _bits; }
    std::vector<std::string> names() const;

private:
    std::uint8_t _bits = 0;
};

// A principal from the config: "user:NAME", "group:NAME", "uid:N", "gid:N".
struct principal {
    enum class kind : std::uint8_t { user, group, uid, gid };
    kind what = kind::uid;
    std::string name;   // user or group name (kind user/group)
    std::uint32_t id = 0;  // uid/gid (kind uid/gid, and group after resolution)

    // Strict: the prefix must be one of the four, a NAME non-empty, N a
    // decimal uint32 without sign or spaces.
    static rtcore::result<principal> parse(std::string_view text);
    std::string to_string() const;
};

// principal::parse, with a group name resolved to its gid (getgrnam_r);
// fails naming the group when it does not exist.
rtcore::result<principal> resolve_principal(std::string_view text);

// The daemon's translation of [roles] in qrtd.toml.
struct role_map {
    std::vector<std::string> reader;
    std::vector<std::string> scheduler;
    std::vector<std::string> calibration;
    std::vector<std::string> admin;
};

// What the kernel says about a connected peer.
struct peer_identity {
    uid_t uid = 0;
    gid_t gid = 0;
    pid_t pid = 0;
    std::vector<gid_t> groups;  // supplementary groups, primary gid included
    std::string user_name;      // empty when the uid has no passwd entry
    std::string groups_source;  // "SO_PEERGROUPS" or "getgrouplist"

    // The tenant id: the user name, or "uid:N".
    std::string tenant() const;
    bool in_group(gid_t g) const;
};

// uid -> what NSS said (user name, and the groups when the kernel could not
// give them), remembered so that the accept path does not ask NSS
// (getpwuid_r: files, but also LDAP or sssd, which may block) for every
// connection.  A uid is looked up at most once per ttl, its absence (no
// passwd entry) included; at most `capacity` uids are held, the oldest
// lookup dropped first.  Single-threaded (the event loop): the server fills
// it from its nss_resolver (find/store); user_name() looks up in place.
struct nss_cache_options {
    std::size_t capacity = 256;
    std::int64_t ttl_ns = 60'000'000'000;  // 60 s
};

// What NSS is asked about a connecting uid, and what it answers.
struct nss_query {
    uid_t uid = 0;
    gid_t gid = 0;
    bool want_groups = false;  // the kernel gave no SO_PEERGROUPS
};
struct nss_answer {
    std::optional<std::string> user_name;      // nullopt: no passwd entry
    std::optional<std::vector<gid_t>> groups;  // getgrouplist, when asked and found
    // Nonzero: NSS failed (getpwuid_r's error, EIO for a lookup that threw);
    // the peer's name is unknown -- not "no entry" -- and the answer is
    // never cached.
    int error = 0;
};

class nss_cache {
public:
    using options = nss_cache_options;
    // nullopt: no passwd entry.  Throws std::system_error when NSS failed.
    using lookup = std::function<std::optional<std::string>(uid_t)>;

    // lookup empty: getpwuid_r.
    explicit nss_cache(options o = options(), lookup user_name = {});

    // Looks up in place (blocking) when the uid is not fresh in the table.
    // A lookup that throws (NSS failed) is not remembered: the exception
    // goes to the caller.
    std::optional<std::string> user_name(uid_t uid, std::int64_t now_ns);
    // The fresh answer for uid (with groups, when want_groups), or nullptr.
    const nss_answer* find(uid_t uid, std::int64_t now_ns, bool want_groups) const;
    void store(uid_t uid, const nss_answer& a, std::int64_t now_ns);
    std::size_t size() const noexcept { return _entries.size(); }
    std::uint64_t lookups() const noexcept { return _lookups; }

private:
    struct entry {
        nss_answer answer;
        std::int64_t looked_up_ns = 0;
    };
    options _opts;
    lookup _lookup;
    std::unordered_map<uid_t, entry> _entries;
    std::uint64_t _lookups = 0;
};

// SO_PEERCRED + SO_PEERGROUPS (or getgrouplist) + getpwuid_r (through
// `names` when given, at now_ns).  Blocks on NSS: the event loop uses
// peer_credentials_of() and an nss_resolver instead.
rtcore::result<peer_identity> peer_identity_of(int fd, nss_cache* names = nullptr,
                                               std::int64_t now_ns = 0);

// What the kernel alone says about a peer (SO_PEERCRED, SO_PEERGROUPS): never
// asks NSS, never blocks.  user_name is empty; groups_source is empty when
// the kernel could not give the groups (then they must come from
// getgrouplist on the user's name).
rtcore::result<peer_identity> peer_credentials_of(int fd);

using nss_lookup = std::function<nss_answer(const nss_query&)>;
// The real lookup: getpwuid_r, then getgrouplist when asked.  May block for
// as long as NSS (LDAP, sssd) takes.  getpwuid_r returning 0 without an
// entry is "no such user"; returning an error (EIO, EMFILE, ENOMEM, ...) is
// answer.error.
nss_answer nss_lookup_system(const nss_query& q);
// The same over another getpwuid_r (a seam for tests: an NSS that fails).
using getpwuid_r_fn = int (*)(uid_t, passwd*, char*, std::size_t, passwd**);
nss_answer nss_lookup_with(const nss_query& q, getpwuid_r_fn getpwuid);

// Completes a kernel identity with what NSS answered.
void apply_nss_answer(peer_identity& id, const nss_answer& a);

// Asks NSS off the event loop: one thread, a bounded queue of uids.  The
// event loop submits a query and gets the answer through `on_answer`, called
// on the resolver thread (the server posts it back to the loop).  A query
// for a uid already queued or being looked up is folded into it.  When
// `queue_capacity` uids wait, submit() refuses.  Destruction does not wait
// for a lookup stuck in NSS longer than `stop_wait`: the thread is then left
// to finish (or die with the process) on state it shares with nobody else.
class nss_resolver {
public:
    struct options {
        std::size_t queue_capacity = 64;
        std::chrono::milliseconds stop_wait{1000};
    };
    using answer_fn = std::function<void(const nss_query&, nss_answer)>;

    // lookup empty: nss_lookup_system.
    nss_resolver(options o, nss_lookup lookup, answer_fn on_answer);
    ~nss_resolver();
    nss_resolver(const nss_resolver&) = delete;
    nss_resolver& operator=(const nss_resolver&) = delete;

    enum class submitted : std::uint8_t { queued, joined, full };
    submitted submit(const nss_query& q);
    std::size_t pending() const;
    std::uint64_t lookups() const;

private:
    struct shared;
    std::shared_ptr<shared> _s;
};

// Does a (resolved) principal name this peer?
bool principal_matches(const principal& who, const peer_identity& peer) noexcept;

// A role_map with its group names resolved to gids.
class authorizer {
public:
    // Fails, naming the entry, when a principal does not parse or a group
    // name does not resolve (user names are matched by name at connect time,
    // so a user that does not exist yet is not an error).
    static rtcore::result<authorizer> compile(const role_map& map);

    role_set roles_of(const peer_identity& peer) const;

private:
    struct grant {
        principal who;
        role what;
    };
    std::vector<grant> _grants;
};

}  // namespace qrt::rpc
