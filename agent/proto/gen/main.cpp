// qrt-protogen: writes every language's copy of qrtd's protocol table
// (agent/proto/protocol.toml), or checks that the checked-in copies are
// current.  See agent/proto/README.md.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model.hpp"

namespace fs = std::filesystem;
using namespace qrt::protogen;

namespace {

std::string read_file(const fs::path& p, bool& ok) {
    std::ifstream in(p, std::ios::binary);
    ok = static_cast<bool>(in);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// The first line where two texts differ, for the staleness message.
std::string first_difference(const std::string& want, const std::string& have) {
    std::istringstream a(want);
    std::istringstream b(have);
    std::string la;
    std::string lb;
    for (int line = 1;; ++line) {
        const bool ga = static_cast<bool>(std::getline(a, la));
        const bool gb = static_cast<bool>(std::getline(b, lb));
        if (!ga && !gb) {
            return "they differ only in the last line's end";
        }
        if (ga != gb || la != lb) {
            return "line " + std::to_string(line) + ": the table gives\n      " + (ga ? la : "(end of file)") +
                   "\n    the file has\n      " + (gb ? lb : "(end of file)");
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"qrt-protogen: the protocol table's copies for C, C++, Python and Go"};
    app.footer(std::string(
        "Examples:\n"
        "  qrt-protogen --table agent/proto/protocol.toml --check .     # fail when a copy is stale\n"
        "  qrt-protogen --table agent/proto/protocol.toml --write .     # rewrite every copy\n"
        "  qrt-protogen --table agent/proto/protocol.toml --lang python # print one copy\n"
        "tools/dev/regen-proto.sh runs --write from the repository's top."));
    std::string table = "agent/proto/protocol.toml";
    std::string check_root;
    std::string write_root;
    std::string lang;
    app.add_option("--table", table, "the protocol table (TOML)")->check(CLI::ExistingFile);
    auto* check = app.add_option("--check", check_root, "compare every copy under this repository top");
    auto* write = app.add_option("--write", write_root, "write every copy under this repository top");
    auto* one = app.add_option("--lang", lang, "print one copy to stdout: c, cpp, python or go");
    check->excludes(write)->excludes(one);
    write->excludes(one);
    // CLI11 takes the arguments reversed; parsing a vector (as qrtctl does)
    // keeps gcc's -Wnull-dereference quiet about CLI11's own argv split.
    std::vector<std::string> args(argv + 1, argv + argc);
    std::reverse(args.begin(), args.end());
    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    const auto loaded = load(table);
    if (!loaded.m) {
        std::cerr << "qrt-protogen: " << loaded.error << "\n";
        return 2;
    }
    const model& m = *loaded.m;
    if (!lang.empty() && lang != "c" && lang != "cpp" && lang != "python" && lang != "go") {
        std::cerr << "qrt-protogen: --lang " << lang << " is not one of c, cpp, python, go\n";
        return 2;
    }
    if (!lang.empty()) {
        std::cout << (lang == "c" ? write_c(m)
                      : lang == "cpp" ? write_cpp(m)
                      : lang == "python" ? write_python(m)
                                         : write_go(m));
        return 0;
    }
    if (!write_root.empty()) {
        for (const auto& out : generate(m)) {
            const fs::path p = fs::path(write_root) / out.path;
            bool ok = false;
            if (read_file(p, ok) == out.text && ok) {
                continue;
            }
            fs::create_directories(p.parent_path());
            std::ofstream f(p, std::ios::binary | std::ios::trunc);
            f << out.text;
            if (!f.flush()) {
                std::cerr << "qrt-protogen: cannot write " << p << "\n";
                return 1;
            }
            std::cout << "wrote " << out.path << "\n";
        }
        return 0;
    }
    if (check_root.empty()) {
        std::cerr << "qrt-protogen: say --check DIR, --write DIR or --lang LANG (--help)\n";
        return 2;
    }
    int stale = 0;
    for (const auto& out : generate(m)) {
        const fs::path p = fs::path(check_root) / out.path;
        bool ok = false;
        const std::string have = read_file(p, ok);
        if (!ok) {
            std::cerr << "stale: " << out.path << " is missing\n";
            ++stale;
        } else if (have != out.text) {
            std::cerr << "stale: " << out.path << " differs from what " << table << " gives; "
                      << first_difference(out.text, have) << "\n";
            ++stale;
        }
    }
    if (stale > 0) {
        std::cerr << stale << " generated file(s) are stale: run tools/dev/regen-proto.sh and commit them\n";
        return 1;
    }
    std::cout << "every generated protocol file is current\n";
    return 0;
}
