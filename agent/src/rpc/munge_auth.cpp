#include "qrt/rpc/munge_auth.hpp"

#include <munge.h>
#include <pthread.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace qrt::rpc {

std::string make_nonce() {
    unsigned char raw[16];
    std::size_t got = 0;
    while (got < sizeof raw) {
        const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
        if (n > 0) {
            got += static_cast<std::size_t>(n);
        } else if (n < 0 && errno != EINTR) {
            std::abort();  // no randomness: no nonce can be trusted
        }
    }
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * sizeof raw);
    for (const unsigned char b : raw) {
        out.push_back(hex[b >> 4U]);
        out.push_back(hex[b & 15U]);
    }
    return out;
}

credential_check munge_check(const std::string& socket, std::string_view credential) {
    credential_check out;
    const std::string cred(credential);
    munge_ctx_t ctx = ::munge_ctx_create();
    if (ctx == nullptr) {
        out.cause = std::string(auth_cause::munge_unavailable);
        out.message = "munge_ctx_create failed (out of memory)";
        return out;
    }
    if (!socket.empty()) {
        (void)::munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket.c_str());
    }
    void* buf = nullptr;
    int len = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    const munge_err_t e = ::munge_decode(cred.c_str(), ctx, &buf, &len, &uid, &gid);
    time_t encoded = 0;
    int ttl = 0;
    (void)::munge_ctx_get(ctx, MUNGE_OPT_ENCODE_TIME, &encoded);
    (void)::munge_ctx_get(ctx, MUNGE_OPT_TTL, &ttl);
    const std::string munge_text = ::munge_ctx_strerror(ctx) != nullptr ? ::munge_ctx_strerror(ctx)
                                                                        : ::munge_strerror(e);
    const std::string got = buf != nullptr && len > 0
                                ? std::string(static_cast<const char*>(buf), static_cast<std::size_t>(len))
                                : std::string();
    std::free(buf);
    ::munge_ctx_destroy(ctx);
    out.uid = uid;
    out.gid = gid;
    out.encoded_s = static_cast<std::int64_t>(encoded);
    out.ttl_s = ttl;
    const std::int64_t now = static_cast<std::int64_t>(::time(nullptr));
    switch (e) {
        case EMUNGE_SUCCESS:
            break;
        case EMUNGE_CRED_EXPIRED:
            out.cause = std::string(auth_cause::expired);
            out.message = fmt::format(
                "the MUNGE credential expired: encoded {} s ago with a TTL of {} s (the clocks of the "
                "client's node and this host disagree, or the credential was kept too long)",
                now - out.encoded_s, ttl);
            return out;
        case EMUNGE_CRED_REWOUND:
            out.cause = std::string(auth_cause::rewound);
            out.message = fmt::format(
                "the MUNGE credential was encoded {} s in this host's future: the clocks of the "
                "client's node and this host disagree",
                out.encoded_s - now);
            return out;
        case EMUNGE_CRED_REPLAYED:
            out.cause = std::string(auth_cause::replayed);
            out.message = "the MUNGE credential was already used (replayed); a client makes a new one "
                          "for every connection";
            return out;
        case EMUNGE_CRED_INVALID:
        case EMUNGE_BAD_REALM:
            out.cause = std::string(auth_cause::invalid);
            out.message = fmt::format(
                "the MUNGE credential does not verify under this host's munge key (encoded with "
                "another key, or altered): {}",
                munge_text);
            return out;
        case EMUNGE_BAD_CRED:
        case EMUNGE_BAD_VERSION:
        case EMUNGE_BAD_CIPHER:
        case EMUNGE_BAD_MAC:
        case EMUNGE_BAD_ZIP:
        case EMUNGE_BAD_LENGTH:
        case EMUNGE_BAD_ARG:
        case EMUNGE_CRED_UNAUTHORIZED:
            out.cause = std::string(auth_cause::malformed);
            out.message = fmt::format("not a usable MUNGE credential: {}", munge_text);
            return out;
        default:
            out.cause = std::string(auth_cause::munge_unavailable);
            out.message = fmt::format("this host's munged could not decode the credential ({}{}): {}",
                                      socket.empty() ? "default socket" : "socket ", socket, munge_text);
            return out;
    }
    out.payload = got;
    out.ok = true;
    return out;
}

void check_binding(credential_check& r, std::string_view nonce, const std::vector<std::string>& names) {
    if (!r.ok) {
        return;
    }
    const auto refuse = [&](std::string_view cause, std::string message) {
        r.ok = false;
        r.cause = std::string(cause);
        r.message = std::move(message);
    };
    const std::string_view p = r.payload;
    const std::string head = fmt::format("{} {} ", auth_payload_version, nonce);
    if (p.substr(0, head.size()) != head) {
        if (p.substr(0, 13) == "qrtd-auth-v1 ") {
            refuse(auth_cause::address_mismatch,
                   "the MUNGE credential binds no address (qrtd-auth-v1: a client older than this "
                   "qrtd); upgrade the client (libqrt-client, qrtctl, qrt_client.py) so that it signs "
                   "the address it dialled");
        } else if (p.substr(0, auth_payload_version.size() + 1) == fmt::format("{} ", auth_payload_version)) {
            refuse(auth_cause::nonce_mismatch,
                   "the MUNGE credential was made for another connection (its payload is not this "
                   "connection's challenge)");
        } else {
            refuse(auth_cause::nonce_mismatch,
                   "the MUNGE credential's payload is not this connection's challenge");
        }
        return;
    }
    const std::string_view signed_for = p.substr(head.size());
    const auto canonical = canonical_tcp_address(signed_for);
    if (canonical && std::find(names.begin(), names.end(), *canonical) != names.end()) {
        return;
    }
    // What a relay would show: the client dialled another listener, which
    // passed it this qrtd's challenge.
    refuse(auth_cause::address_mismatch,
           fmt::format("the MUNGE credential was made for {}, which is not this qrtd ({}): the client "
                       "dialled another listener, which passed it this qrtd's challenge (a relay); "
                       "nothing is served.  Clients must dial this qrtd's address (rpc.listen, or "
                       "rpc.listen_aliases for an address translated on the way)",
                       signed_for.substr(0, 80), fmt::join(names, ", ")));
}

// ------------------------------------------------------- credential_verifier

struct credential_verifier::shared {
    struct item {
        std::uint64_t id = 0;
        std::string credential;
    };
    options opts;
    credential_decoder decode;
    answer_fn on_answer;
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<item> queue;
    bool busy = false;
    bool stop = false;
    bool exited = false;
    std::condition_variable exited_cv;
};

credential_verifier::credential_verifier(options o, credential_decoder decode, answer_fn on_answer)
    : _s(std::make_shared<shared>()) {
    _s->opts = o;
    _s->opts.queue_capacity = std::max<std::size_t>(1, o.queue_capacity);
    _s->decode = std::move(decode);
    _s->on_answer = std::move(on_answer);
    // The thread holds the state: when destruction gives up on a decode
    // stuck in munged, the thread still has everything it touches.
    std::thread([s = _s] {
        ::pthread_setname_np(::pthread_self(), "qrtd-munge");
        std::unique_lock<std::mutex> lock(s->mu);
        while (true) {
            s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
            if (s->stop) {
                break;
            }
            shared::item it = std::move(s->queue.front());
            s->queue.pop_front();
            s->busy = true;
            lock.unlock();
            credential_check r;
            try {
                r = s->decode(it.credential);
            } catch (const std::exception& ex) {
                r = credential_check{};
                r.cause = std::string(auth_cause::munge_unavailable);
                r.message = ex.what();
            }
            lock.lock();
            s->busy = false;
            if (s->stop) {
                break;
            }
            s->on_answer(it.id, std::move(r));  // under the lock: never after the owner has gone
        }
        s->exited = true;
        s->exited_cv.notify_all();
    }).detach();
}

credential_verifier::~credential_verifier() {
    std::unique_lock<std::mutex> lock(_s->mu);
    _s->stop = true;
    _s->queue.clear();
    _s->cv.notify_all();
    _s->exited_cv.wait_for(lock, _s->opts.stop_wait, [&] { return _s->exited; });
}

bool credential_verifier::submit(std::uint64_t id, std::string credential) {
    const std::lock_guard<std::mutex> lock(_s->mu);
    if (_s->queue.size() >= _s->opts.queue_capacity) {
        return false;
    }
    _s->queue.push_back({id, std::move(credential)});
    _s->cv.notify_one();
    return true;
}

std::size_t credential_verifier::pending() const {
    const std::lock_guard<std::mutex> lock(_s->mu);
    return _s->queue.size() + (_s->busy ? 1U : 0U);
}

}  // namespace qrt::rpc
