#include <gtest/gtest.h>

#include "qrt/dispatch/endpoint.hpp"

using namespace qrt::dispatch;

TEST(endpoint_uri, parses_unix_tcp_and_file) {
    auto u = parse_endpoint("unix:///run/qrtd/qpu0.sock");
    ASSERT_TRUE(u) << u.err().message;
    EXPECT_EQ(u->kind, endpoint_kind::unix_stream);
    EXPECT_EQ(u->path, "/run/qrtd/qpu0.sock");

    auto t = parse_endpoint("tcp://127.0.0.1:7000");
    ASSERT_TRUE(t) << t.err().message;
    EXPECT_EQ(t->kind, endpoint_kind::tcp);
    EXPECT_EQ(t->host, "127.0.0.1");
    EXPECT_EQ(t->port, 7000);

    auto f = parse_endpoint("file:///dev/qpu0");
    ASSERT_TRUE(f) << f.err().message;
    EXPECT_EQ(f->kind, endpoint_kind::file);
    EXPECT_EQ(f->path, "/dev/qpu0");
}

TEST(endpoint_uri, rejects_malformed_uris_naming_the_problem) {
    const struct {
        const char* uri;
        const char* says;
    } bad[] = {
        {"http://127.0.0.1:80", "scheme"},
        {"unix://relative/path", "absolute"},
        {"file://dev/x", "absolute"},
        {"tcp://localhost:7000", "IPv4"},
        {"tcp://127.0.0.1", "expected tcp://"},
        {"tcp://127.0.0.1:0", "1..65535"},
        {"tcp://127.0.0.1:65536", "1..65535"},
        {"tcp://127.0.0.1:70x", "1..65535"},
        {"unix:///aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "107 bytes"},
    };
    for (const auto& b : bad) {
        auto r = parse_endpoint(b.uri);
        ASSERT_FALSE(r) << b.uri;
        EXPECT_NE(r.err().message.find(b.says), std::string::npos) << b.uri << ": " << r.err().message;
        EXPECT_NE(r.err().message.find(b.uri), std::string::npos) << "the error names the URI";
    }
}

TEST(endpoint_listen, tcp_listen_is_loopback_only) {
    auto a = parse_endpoint("tcp://10.1.2.3:7000");
    ASSERT_TRUE(a);
    auto l = listen_endpoint(*a);
    ASSERT_FALSE(l);
    EXPECT_NE(l.err().message.find("loopback"), std::string::npos) << l.err().message;
}

TEST(endpoint_connect, a_missing_unix_socket_fails_naming_the_uri) {
    auto a = parse_endpoint("unix:///nonexistent/qrt-test.sock");
    ASSERT_TRUE(a);
    auto c = start_connect(*a);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.err().code, ENOENT);
    EXPECT_NE(c.err().message.find("unix:///nonexistent/qrt-test.sock"), std::string::npos) << c.err().message;
}
