#pragma once
// Files that are never seen half-written (reports, the node_exporter
// textfile): write <path>.tmp.<pid> in the same directory, fsync it, rename
// it over path, then fsync the directory so the rename itself is durable.
//
// On a failure before the rename the temporary file is removed and path is
// left as it was.  A failure to fsync the directory is reported, but path
// already holds the new content then.  The error names the call and the path
// ("rename /x/out.json.tmp.42 -> /x/out.json: Is a directory").

#include <string>
#include <string_view>

#include "rtcore/error.hpp"

namespace rtcore {

status write_file_atomically(const std::string& path, std::string_view content);

}  // namespace rtcore
