#pragma once
// qrtctl as a library: the command table, option parsing and execution, so
// the unit tests drive it exactly as main() does (with captured output).

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace qrtctl {

// Runs one command line (argv[0] included) and returns the exit status.
// Output goes to out, diagnostics to err.
int run(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// The EXIT STATUS table, as printed in --help and `qrtctl exit-codes`
// (and mirrored in qrtctl.1; a test keeps the two in step).
struct exit_row {
    int exit_code;
    std::string reason;
    std::string meaning;
};
std::vector<exit_row> exit_table();
std::string exit_table_text();

}  // namespace qrtctl
