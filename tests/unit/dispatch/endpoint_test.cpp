#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>

#include "qrt/proto/endpoint.hpp"

using namespace qrt;

TEST(endpoint_uri, parses_unix_tcp_and_file) {
    auto u = proto::parse_endpoint("unix:///run/qrtd/qpu0.sock");
    ASSERT_TRUE(u) << u.err().message;
    EXPECT_EQ(u->kind, proto::endpoint_kind::unix_stream);
    EXPECT_EQ(u->path, "/run/qrtd/qpu0.sock");

    auto t = proto::parse_endpoint("tcp://127.0.0.1:7000");
    ASSERT_TRUE(t) << t.err().message;
    EXPECT_EQ(t->kind, proto::endpoint_kind::tcp);
    EXPECT_EQ(t->host, "127.0.0.1");
    EXPECT_EQ(t->port, 7000);

    auto f = proto::parse_endpoint("file:///dev/qpu0");
    ASSERT_TRUE(f) << f.err().message;
    EXPECT_EQ(f->kind, proto::endpoint_kind::file);
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
        auto r = proto::parse_endpoint(b.uri);
        ASSERT_FALSE(r) << b.uri;
        EXPECT_NE(r.err().message.find(b.says), std::string::npos) << b.uri << ": " << r.err().message;
        EXPECT_NE(r.err().message.find(b.uri), std::string::npos) << "the error names the URI";
    }
}

TEST(endpoint_listen, tcp_listen_is_loopback_only) {
    auto a = proto::parse_endpoint("tcp://10.1.2.3:7000");
    ASSERT_TRUE(a);
    auto l = proto::listen_endpoint(*a);
    ASSERT_FALSE(l);
    EXPECT_NE(l.err().message.find("loopback"), std::string::npos) << l.err().message;
}

TEST(endpoint_connect, a_missing_unix_socket_fails_naming_the_uri) {
    auto a = proto::parse_endpoint("unix:///nonexistent/qrt-test.sock");
    ASSERT_TRUE(a);
    auto c = proto::start_connect(*a);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.err().code, ENOENT);
    EXPECT_NE(c.err().message.find("unix:///nonexistent/qrt-test.sock"), std::string::npos) << c.err().message;
}

// A file:// endpoint is a character device or a FIFO; anything else is
// refused before it is opened, naming the path, what it is and what would do.
TEST(endpoint_connect, a_file_endpoint_that_is_not_a_device_or_fifo_is_refused_naming_path_type_and_what_is_accepted) {
    char dir_tmpl[] = "/tmp/qrt-endpoint-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_tmpl), nullptr);
    const std::string dir = dir_tmpl;
    const std::string regular = dir + "/frames.bin";
    ASSERT_EQ(::close(::open(regular.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)), 0);
    const std::string sock = dir + "/qpu.sock";
    const int sfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock.c_str());
    ASSERT_EQ(::bind(sfd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa), 0);
    const struct {
        std::string path;
        int code;
        std::string what;
    } cases[] = {
        {regular, EINVAL, "is a regular file"},
        {dir, EINVAL, "is a directory"},
        {sock, EINVAL, "is a socket"},
        {dir + "/missing", ENOENT, "does not exist"},
    };
    for (const auto& c : cases) {
        const std::string uri = "file://" + c.path;
        auto a = proto::parse_endpoint(uri);
        ASSERT_TRUE(a) << a.err().message;
        auto att = proto::start_connect(*a);
        ASSERT_FALSE(att) << uri << " was accepted";
        const std::string& m = att.err().message;
        EXPECT_EQ(att.err().code, c.code) << m;
        EXPECT_NE(m.find("endpoint " + uri + ": " + c.path + " " + c.what), std::string::npos) << m;
        EXPECT_NE(m.find("must be a character device (the QPU's driver) or a FIFO"), std::string::npos) << m;
    }
    auto s = proto::start_connect(*proto::parse_endpoint("file://" + sock));
    ASSERT_FALSE(s);
    EXPECT_NE(s.err().message.find("write unix://" + sock), std::string::npos) << s.err().message;
    struct stat st {};
    ASSERT_EQ(::stat(regular.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << "the regular file was written to";
    ::close(sfd);
    std::filesystem::remove_all(dir);
}

TEST(endpoint_connect, a_fifo_and_a_character_device_are_accepted_as_file_endpoints) {
    char dir_tmpl[] = "/tmp/qrt-endpoint-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_tmpl), nullptr);
    const std::string fifo = std::string(dir_tmpl) + "/qpu0";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto f = proto::start_connect(*proto::parse_endpoint("file://" + fifo));
    ASSERT_TRUE(f) << f.err().message << " (a FIFO opened O_RDWR needs no reader yet)";
    EXPECT_EQ(f->file_type, proto::file_endpoint_type::fifo);
    auto d = proto::start_connect(*proto::parse_endpoint("file:///dev/null"));
    ASSERT_TRUE(d) << d.err().message;
    EXPECT_EQ(d->file_type, proto::file_endpoint_type::char_device);
    std::filesystem::remove_all(dir_tmpl);
}
