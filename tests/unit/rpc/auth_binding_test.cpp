// What a network listener's MUNGE credential binds (qrt/proto/auth_binding.hpp,
// check_binding): the address text both sides write, and each refusal of a
// decoded payload, without munged (the integration tests use a real one).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>
#include <vector>

#include "qrt/proto/auth_binding.hpp"
#include "qrt/rpc/munge_auth.hpp"

namespace rpc = qrt::rpc;

TEST(auth_binding, addresses_are_written_one_way_whatever_form_they_came_in) {
    EXPECT_EQ(rpc::canonical_tcp_address("tcp://10.0.0.5:7470"), "tcp://10.0.0.5:7470");
    EXPECT_EQ(rpc::canonical_tcp_address("tcp://[FD00:0:0::5]:7470"), "tcp://[fd00::5]:7470");
    // An IPv4-mapped IPv6 address is the IPv4 one (a dual-stack socket's view).
    EXPECT_EQ(rpc::canonical_tcp_address("tcp://[::ffff:10.0.0.5]:7470"), "tcp://10.0.0.5:7470");
    for (const char* bad : {"10.0.0.5:7470", "tcp://qpu1:7470", "tcp://10.0.0.5", "tcp://10.0.0.5:99999",
                            "tcp://[fd00::5:7470", "tcp://10.0.0.5:7470 tcp://10.0.0.6:7470"}) {
        EXPECT_EQ(rpc::canonical_tcp_address(bad), std::nullopt) << bad;
    }
    sockaddr_in6 mapped{};
    mapped.sin6_family = AF_INET6;
    mapped.sin6_port = htons(7470);
    ASSERT_EQ(::inet_pton(AF_INET6, "::ffff:127.0.0.2", &mapped.sin6_addr), 1);
    EXPECT_EQ(rpc::tcp_address_text(reinterpret_cast<const sockaddr*>(&mapped)), "tcp://127.0.0.2:7470");
    EXPECT_EQ(rpc::auth_payload("ab12", "tcp://10.0.0.5:7470"), "qrtd-auth-v2 ab12 tcp://10.0.0.5:7470");
}

namespace {

// A credential munged decoded, carrying `payload`.
rpc::credential_check decoded(std::string payload) {
    rpc::credential_check r;
    r.ok = true;
    r.uid = 1000;
    r.payload = std::move(payload);
    return r;
}

}  // namespace

TEST(auth_binding, only_a_payload_naming_this_nonce_and_one_of_its_addresses_passes) {
    const std::vector<std::string> names{"tcp://10.0.0.5:7470", "tcp://192.0.2.7:30470"};
    auto good = decoded("qrtd-auth-v2 ab12 tcp://10.0.0.5:7470");
    rpc::check_binding(good, "ab12", names);
    EXPECT_TRUE(good.ok) << good.message;
    auto alias = decoded("qrtd-auth-v2 ab12 tcp://192.0.2.7:30470");
    rpc::check_binding(alias, "ab12", names);
    EXPECT_TRUE(alias.ok) << alias.message;

    // Made for a relay's address: refused, naming both.
    auto relayed = decoded("qrtd-auth-v2 ab12 tcp://10.0.0.9:7470");
    rpc::check_binding(relayed, "ab12", names);
    EXPECT_FALSE(relayed.ok);
    EXPECT_EQ(relayed.cause, rpc::auth_cause::address_mismatch);
    EXPECT_NE(relayed.message.find("tcp://10.0.0.9:7470"), std::string::npos) << relayed.message;
    EXPECT_NE(relayed.message.find("tcp://10.0.0.5:7470"), std::string::npos) << relayed.message;
    // The same port on another address, another port on the same address.
    for (const char* other : {"tcp://10.0.0.5:7471", "tcp://[fd00::5]:7470", "tcp://10.0.0.5:7470 x", ""}) {
        auto r = decoded(std::string("qrtd-auth-v2 ab12 ") + other);
        rpc::check_binding(r, "ab12", names);
        EXPECT_EQ(r.cause, rpc::auth_cause::address_mismatch) << other;
    }
    // A client older than the address binding.
    auto v1 = decoded("qrtd-auth-v1 ab12");
    rpc::check_binding(v1, "ab12", names);
    EXPECT_EQ(v1.cause, rpc::auth_cause::address_mismatch);
    EXPECT_NE(v1.message.find("binds no address"), std::string::npos) << v1.message;
    // Another connection's nonce, or no payload of ours at all.
    for (const char* p : {"qrtd-auth-v2 cd34 tcp://10.0.0.5:7470", "hello", ""}) {
        auto r = decoded(p);
        rpc::check_binding(r, "ab12", names);
        EXPECT_EQ(r.cause, rpc::auth_cause::nonce_mismatch) << p;
    }
    // What munged refused stays refused as munged said.
    rpc::credential_check refused;
    refused.cause = std::string(rpc::auth_cause::replayed);
    rpc::check_binding(refused, "ab12", names);
    EXPECT_EQ(refused.cause, rpc::auth_cause::replayed);
}
