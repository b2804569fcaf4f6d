#pragma once
// Output files are never half-written: write <path>.tmp.<pid> in the same
// directory, fsync, rename over path.  On any failure the temporary file is
// removed and path is left as it was.

#include <string>
#include <string_view>

#include "rtcore/error.hpp"

namespace qrt::jitter {

rtcore::status write_file_atomically(const std::string& path, std::string_view content);

}  // namespace qrt::jitter
