#include "rtcore/atomic_file.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace fs = std::filesystem;

namespace {

struct temp_dir {
    fs::path path;
    temp_dir() {
        path = fs::temp_directory_path() /
               ("rtcore-atomic-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    std::size_t entries() const {
        std::size_t n = 0;
        for ([[maybe_unused]] const auto& e : fs::directory_iterator(path)) {
            ++n;
        }
        return n;
    }
};

std::string read_all(const fs::path& p) {
    std::ifstream in(p);
    std::ostringstream got;
    got << in.rdbuf();
    return got.str();
}

}  // namespace

TEST(atomic_file, creates_then_replaces_and_leaves_no_temporary) {
    temp_dir d;
    const auto p = (d.path / "out.prom").string();
    ASSERT_TRUE(rtcore::write_file_atomically(p, "a 1\n"));
    EXPECT_EQ(read_all(p), "a 1\n");
    ASSERT_TRUE(rtcore::write_file_atomically(p, std::string(100'000, 'x')));
    EXPECT_EQ(read_all(p).size(), 100'000U);
    ASSERT_TRUE(rtcore::write_file_atomically(p, ""));
    EXPECT_EQ(read_all(p), "");
    EXPECT_EQ(d.entries(), 1U);
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::owner_write, fs::perms::owner_write);
}

TEST(atomic_file, a_bare_name_is_written_in_the_working_directory) {
    temp_dir d;
    const auto old = fs::current_path();
    fs::current_path(d.path);
    const auto st = rtcore::write_file_atomically("bare.txt", "here");
    fs::current_path(old);
    ASSERT_TRUE(st) << st.err().message;
    EXPECT_EQ(read_all(d.path / "bare.txt"), "here");
}

TEST(atomic_file, a_failed_rename_keeps_the_target_and_removes_the_temporary) {
    temp_dir d;
    const auto dir = (d.path / "a-dir").string();
    fs::create_directories(dir);
    const auto st = rtcore::write_file_atomically(dir, "x");
    ASSERT_FALSE(st);
    EXPECT_EQ(st.err().code, EISDIR);
    EXPECT_NE(st.err().message.find("rename " + dir + ".tmp."), std::string::npos)
        << st.err().message;
    EXPECT_TRUE(fs::is_directory(dir));
    EXPECT_EQ(d.entries(), 1U);
}

TEST(atomic_file, errors_name_the_call_and_the_path) {
    temp_dir d;
    const auto missing = (d.path / "no" / "such" / "f.svg").string();
    const auto st = rtcore::write_file_atomically(missing, "x");
    ASSERT_FALSE(st);
    EXPECT_EQ(st.err().code, ENOENT);
    EXPECT_NE(st.err().message.find("open " + missing + ".tmp."), std::string::npos)
        << st.err().message;

    const auto empty = rtcore::write_file_atomically("", "x");
    ASSERT_FALSE(empty);
    EXPECT_EQ(empty.err().code, EINVAL);
    EXPECT_NE(empty.err().message.find("empty path"), std::string::npos);
}
