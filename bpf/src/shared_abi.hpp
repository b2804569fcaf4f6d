#pragma once
// The C structs shared with the BPF programs (bpf/progs/*.h), for C++.
// Those headers are C and include nothing; here they get __u32/__u64 from
// <linux/types.h>, and their C idioms (casts) are kept out of the strict
// warning set.

#include <linux/types.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wuseless-cast"
extern "C" {
#include "intrusions.h"
#include "outliers.h"
#include "wakeup.h"
}
#pragma GCC diagnostic pop
