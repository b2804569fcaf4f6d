// qrtctl: the scheduler/admin client of qrtd.  All logic is in qrtctl_lib
// (qrtctl.cpp and the cmd_*.cpp it runs; a library, so tests run it
// in-process); only this file exits.
#include <iostream>
#include <string>
#include <vector>

#include "qrtctl.hpp"

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv, argv + argc);
    return qrtctl::run(args, std::cout, std::cerr);
}
