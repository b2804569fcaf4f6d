#pragma once
// --baseline FILE: compare this run with an earlier --json output.

#include <string>

#include "jitter_report/report.hpp"
#include "rtcore/error.hpp"

namespace qrt::jitter {

// Reads and validates a --json file: unreadable, not JSON (with the byte
// offset), another schema, a newer schema version, or a missing field are
// errors naming the file.
rtcore::result<report> load_baseline(const std::string& path);

// Series are matched on (scope, name, metric); rows for p50 p95 p99 p99.9
// max stddev with current / baseline.
comparison compare(const report& current, const report& baseline, const std::string& file);

}  // namespace qrt::jitter
