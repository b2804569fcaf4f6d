#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "qrt/rpc/framing.hpp"

using qrt::rpc::line_framer;

namespace {
// Every complete line the framer yields, and whether it hit the limit.
std::vector<std::string> drain(line_framer& f, bool* too_long = nullptr) {
    std::vector<std::string> out;
    while (true) {
        const auto it = f.next();
        if (it.st == line_framer::status::need_more) {
            break;
        }
        if (it.st == line_framer::status::too_long) {
            if (too_long != nullptr) {
                *too_long = true;
            }
            break;
        }
        out.emplace_back(it.line);
    }
    f.compact();
    return out;
}
}  // namespace

TEST(line_framer, splits_lines_across_arbitrary_read_boundaries) {
    const std::string stream = "{\"a\":1}\n\n{\"b\":2}\r\n{\"c\":3}\n";
    for (std::size_t piece = 1; piece <= stream.size(); ++piece) {
        line_framer f(64);
        std::vector<std::string> lines;
        for (std::size_t off = 0; off < stream.size(); off += piece) {
            f.append(std::string_view(stream).substr(off, piece));
            for (auto& l : drain(f)) {
                lines.push_back(std::move(l));
            }
        }
        EXPECT_EQ(lines, (std::vector<std::string>{"{\"a\":1}", "", "{\"b\":2}\r", "{\"c\":3}"}))
            << "piece " << piece;
        EXPECT_EQ(f.buffered(), 0U);
    }
}

TEST(line_framer, a_partial_line_waits_for_the_rest) {
    line_framer f(64);
    f.append("{\"jsonrpc\":");
    EXPECT_FALSE(f.has_complete_line());
    EXPECT_TRUE(drain(f).empty());
    EXPECT_EQ(f.buffered(), 11U);
    f.append("\"2.0\"}\n");
    EXPECT_TRUE(f.has_complete_line());
    EXPECT_EQ(drain(f), std::vector<std::string>{"{\"jsonrpc\":\"2.0\"}"});
}

TEST(line_framer, the_limit_is_enforced_before_the_newline_arrives) {
    line_framer f(8);
    f.append("12345678\n");  // exactly the limit: fine
    EXPECT_EQ(drain(f), std::vector<std::string>{"12345678"});
    f.append("123456789");  // one over, no newline yet
    bool too_long = false;
    EXPECT_TRUE(drain(f, &too_long).empty());
    EXPECT_TRUE(too_long);
    line_framer g(8);
    g.append("ok\n123456789\nnext\n");  // the good line first, then the long one
    too_long = false;
    EXPECT_EQ(drain(g, &too_long), std::vector<std::string>{"ok"});
    EXPECT_TRUE(too_long);
}

TEST(line_framer, prepare_and_commit_read_in_place) {
    line_framer f(64);
    char* p = f.prepare(32);
    std::memcpy(p, "a\nb", 3);
    f.commit(3);
    EXPECT_EQ(f.buffered(), 3U);
    EXPECT_EQ(drain(f), std::vector<std::string>{"a"});
    f.prepare(32);
    f.commit(0);  // EAGAIN: nothing was read
    EXPECT_EQ(f.buffered(), 1U);
}
