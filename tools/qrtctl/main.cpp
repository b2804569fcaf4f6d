// qrtctl: the scheduler/admin client of qrtd.  All logic is in qrtctl.cpp
// (a library, so tests run it in-process); only this file exits.
#include <iostream>
#include <string>
#include <vector>

#include "qrtctl.hpp"

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv, argv + argc);
    return qrtctl::run(args, std::cout, std::cerr);
}
