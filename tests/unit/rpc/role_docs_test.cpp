// The roles' documentation names exactly the methods each role opens: the
// meaning of roles.reader, roles.scheduler and roles.calibration in the
// option table (from which qrtd.toml and qrtd.toml(5) are made, and
// test_config checks they are) against the method table the daemon
// registers.  So the docs and the code cannot disagree about who may call
// what.

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "qrt/config_table.hpp"
#include "qrt/rpc/methods.hpp"
#include "qrt/rpc/timeline_methods.hpp"
#include "qrt/timeline/ledger.hpp"

namespace rpc = qrt::rpc;
namespace tl = qrt::timeline;

namespace {

// Every registered method, by the role it requires.
std::vector<rpc::method_info> daemon_methods() {
    rpc::engine e;
    rpc::register_agent_methods(e, rpc::agent_hooks{});
    std::vector<tl::qpu_spec> qpus;
    qpus.push_back(tl::qpu_spec{"q0", tl::periodic_calibration{10'000'000'000, 1'000'000'000, 0, 0.99, 0}});
    auto l = tl::ledger::open(std::move(qpus), tl::ledger_options{}, "", 0);
    EXPECT_TRUE(l) << l.err().message;
    rpc::register_timeline_methods(e, **l, rpc::timeline_options{});
    return e.methods().methods();
}

std::string meaning_of(const char* role) {
    const qrt::config_option* opt = qrt::find_option("roles", role);
    EXPECT_NE(opt, nullptr) << role;
    return opt != nullptr ? std::string(opt->meaning) : std::string();
}

// The method names a text mentions (dotted names, and bare method names as
// whole words).  Scanned by hand: std::regex trips GCC 12's
// -Wmaybe-uninitialized in the ASan build (-Werror).
std::set<std::string> named_in(const std::string& text, const std::vector<rpc::method_info>& all) {
    const auto word_char = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
    std::set<std::string> out;
    std::set<std::string> words;  // bare words, for the names without a dot
    std::size_t i = 0;
    while (i < text.size()) {
        if (!word_char(text[i]) || (i > 0 && (word_char(text[i - 1]) || text[i - 1] == '.'))) {
            ++i;
            continue;
        }
        std::size_t j = i;
        while (j < text.size() && word_char(text[j])) {
            ++j;
        }
        // A dotted name: word '.' (word | '*')+
        if (j + 1 < text.size() && text[j] == '.' && (word_char(text[j + 1]) || text[j + 1] == '*')) {
            std::size_t k = j + 1;
            while (k < text.size() && (word_char(text[k]) || text[k] == '*')) {
                ++k;
            }
            out.insert(text.substr(i, k - i));
            i = k;
            continue;
        }
        words.insert(text.substr(i, j - i));  // a full stop may follow it
        i = j;
    }
    for (const auto& m : all) {
        if (m.name.find('.') == std::string::npos && words.count(m.name) != 0) {
            out.insert(m.name);
        }
    }
    return out;
}

}  // namespace

TEST(role_docs, each_roles_option_names_exactly_the_methods_that_role_opens) {
    const auto all = daemon_methods();
    ASSERT_FALSE(all.empty());
    const std::pair<const char*, rpc::role> roles[] = {
        {"reader", rpc::role::reader},
        {"scheduler", rpc::role::scheduler},
        {"calibration", rpc::role::calibration},
    };
    for (const auto& [name, r] : roles) {
        std::set<std::string> want;
        for (const auto& m : all) {
            // agent.hello needs no role: the reader's text says so.
            if (m.required == r || (r == rpc::role::reader && m.required == rpc::role::none)) {
                want.insert(m.name);
            }
        }
        EXPECT_EQ(named_in(meaning_of(name), all), want)
            << "roles." << name << " says: " << meaning_of(name);
    }
    // The admin may do everything, and its text names no method.
    EXPECT_TRUE(named_in(meaning_of("admin"), all).empty()) << meaning_of("admin");
}
