#include <gtest/gtest.h>

#include "rtcore/kernel_probe.hpp"
