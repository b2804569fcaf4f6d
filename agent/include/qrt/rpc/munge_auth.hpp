#pragma once
// Authentication of the network listener (rpc.listen) by MUNGE.
//
// The handshake, one line each way before any method is served:
//   server, on accept:  {"jsonrpc":"2.0","method":"auth.challenge",
//                        "params":{"mechanism":"munge","nonce":"<32 hex>",
//                                  "payload_version":"qrtd-auth-v2"}}
//   client:             {"jsonrpc":"2.0","id":ID,"method":"auth.munge",
//                        "params":{"credential":"MUNGE:..."}}
//   server:             {"jsonrpc":"2.0","id":ID,"result":{"uid":..,"gid":..,
//                        "tenant":"..","roles":[..]}}
//                       or one `unauthenticated` (or `unavailable`) error
//                       whose data.cause says why, then the connection closes.
// The credential's payload must be exactly auth_payload(nonce, address)
// (qrt/proto/auth_binding.hpp): "qrtd-auth-v2 <nonce> tcp://ADDR:PORT", the
// address being the listener the client dialled, which must be one of this
// server's names for the connection.  A credential made for one connection
// cannot open another (the nonce), one made for another listener cannot
// open this one although that listener relayed this one's challenge (the
// address), and munged's replay cache refuses a credential decoded twice.
// The uid and gid munged vouches for are the caller's identity; its groups
// come from NSS on this host (getgrouplist), and roles resolve as for
// SO_PEERCRED.
//
// Decoding asks munged over its UNIX socket (munge_decode blocks), so it
// runs on one verifier thread with a bounded queue, never on the event loop.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/proto/auth_binding.hpp"

namespace qrt::rpc {

// What a credential signs (qrt/proto/auth_binding.hpp, protocol.toml [auth]).
using proto::auth_payload;
using proto::canonical_tcp_address;
using proto::tcp_address_text;
inline constexpr std::string_view auth_payload_version = proto::auth::payload_version;

// data.cause of a refused authentication (reason `unauthenticated`); stable.
namespace auth_cause {
inline constexpr std::string_view expired = "expired";            // past its TTL
inline constexpr std::string_view rewound = "rewound";            // encoded in the future (clocks)
inline constexpr std::string_view replayed = "replayed";          // munged decoded it before
inline constexpr std::string_view invalid = "invalid";            // another key, or altered
inline constexpr std::string_view malformed = "malformed";        // not a MUNGE credential
inline constexpr std::string_view nonce_mismatch = "nonce_mismatch";  // made for another connection
inline constexpr std::string_view address_mismatch = "address_mismatch";  // made for another listener
inline constexpr std::string_view auth_required = "auth_required";    // a request before auth.munge
inline constexpr std::string_view auth_timeout = "auth_timeout";      // no auth.munge in time
// Reason `unavailable`: this host's munged could not be asked.
inline constexpr std::string_view munge_unavailable = "munge_unavailable";
}  // namespace auth_cause

// 16 random bytes (getrandom), in hex.
std::string make_nonce();

// What decoding one credential gave.
struct credential_check {
    bool ok = false;
    uid_t uid = 0;
    gid_t gid = 0;
    std::string cause;    // auth_cause::*, empty when ok
    std::string message;  // human text naming the problem
    std::int64_t encoded_s = 0;  // munged's encode time (0: unknown)
    std::int64_t ttl_s = 0;
    std::string payload;  // what the credential signs, when decoded
};

// Decode `credential` with the munged at `socket` (ok: munged vouches for
// uid, gid and payload; what the payload binds is check_binding's).  Blocks
// for as long as munged takes.
credential_check munge_check(const std::string& socket, std::string_view credential);

// Whether a decoded credential's payload is auth_payload(nonce, A) with A
// one of `names` (canonical_tcp_address texts): if not, r becomes the
// refusal (nonce_mismatch, address_mismatch), naming what the credential
// was made for.  No-op on a credential munged refused.
void check_binding(credential_check& r, std::string_view nonce, const std::vector<std::string>& names);

using credential_decoder = std::function<credential_check(std::string_view credential)>;

// One thread asking munged, a queue of at most queue_capacity credentials.
// on_answer runs on that thread (the server posts it back to the loop).
// Destruction does not wait past stop_wait for a decode stuck in munged.
class credential_verifier {
public:
    struct options {
        std::size_t queue_capacity = 64;
        std::chrono::milliseconds stop_wait{1000};
    };
    using answer_fn = std::function<void(std::uint64_t id, credential_check)>;

    credential_verifier(options o, credential_decoder decode, answer_fn on_answer);
    ~credential_verifier();
    credential_verifier(const credential_verifier&) = delete;
    credential_verifier& operator=(const credential_verifier&) = delete;

    // false: the queue is full.
    bool submit(std::uint64_t id, std::string credential);
    std::size_t pending() const;

private:
    struct shared;
    std::shared_ptr<shared> _s;
};

}  // namespace qrt::rpc
