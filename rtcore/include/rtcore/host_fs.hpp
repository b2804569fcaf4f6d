#pragma once
// The one seam in front of /proc, /sys and /dev.
//
// Every read or write of a kernel file in qrtd goes through a host_fs.  Paths
// are always written as on the real host ("/proc/irq/36/smp_affinity_list")
// and resolved under a root prefix:
//   - host_fs::system()           root "/", writes really happen;
//   - host_fs{tree}               a fake tree under tests/data/ (or a copy);
//   - host_fs{root, dry_run}      reads happen, writes are only recorded
//                                 (used by `qrtd host plan` and --dry-run).
// Tests can also inject a failing errno for a path, to stand for a managed IRQ
// (EIO) or a read-only /proc (EROFS), which a fake tree cannot produce itself.
//
// Writes, mkdir and rmdir never follow a symlink below the root: the path is
// walked one component at a time with O_NOFOLLOW, and a symlink anywhere in
// it is an error (ELOOP) naming it.  The kernel files qrtd writes have none,
// so the path a caller checked (the restore allow-list) is the file written.

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rtcore/error.hpp"

namespace rtcore {

class host_fs {
public:
    enum class mode { real, dry_run };

    struct planned_write {
        std::string path;
        std::string data;
    };

    explicit host_fs(std::filesystem::path root = "/", mode m = mode::real);
    static host_fs system() { return host_fs("/"); }

    const std::filesystem::path& root() const { return _root; }
    bool is_system() const { return _root == "/"; }
    bool dry_run() const { return _mode == mode::dry_run; }

    // Host path -> path under the root.  host_path must be absolute.
    std::filesystem::path resolve(std::string_view host_path) const;

    result<std::string> read(std::string_view host_path) const;
    // read() with trailing whitespace and newlines removed.
    result<std::string> read_line(std::string_view host_path) const;
    bool exists(std::string_view host_path) const;
    bool is_dir(std::string_view host_path) const;
    // Names of the entries of a directory, sorted, without "." and "..".
    result<std::vector<std::string>> list(std::string_view host_path) const;

    // ok when no component of host_path below the root is a symlink (a
    // missing component ends the walk: nothing there to follow).
    status check_no_symlinks(std::string_view host_path) const;

    // One write(2) of data, as echo does; in dry-run mode only recorded.
    status write(std::string_view host_path, std::string_view data);
    status make_dir(std::string_view host_path);
    status remove_dir(std::string_view host_path);

    const std::vector<planned_write>& planned_writes() const { return _planned; }

    // Tests: make every write to host_path fail with errnum.
    void inject_write_error(std::string host_path, int errnum);

private:
    // The directory holding host_path's last component, opened without
    // following a symlink below the root; second: that last component.
    result<std::pair<int, std::string>> open_parent(std::string_view host_path) const;

    std::filesystem::path _root;
    mode _mode;
    std::vector<planned_write> _planned;
    std::map<std::string, int, std::less<>> _write_faults;
};

}  // namespace rtcore
