#pragma once
// Output files are never half-written: rtcore's write_file_atomically
// (write <path>.tmp.<pid> in the same directory, fsync, rename over path,
// fsync the directory).  On a failure before the rename the temporary file
// is removed and path is left as it was.

#include "rtcore/atomic_file.hpp"

namespace qrt::jitter {

using rtcore::write_file_atomically;

}  // namespace qrt::jitter
