#include "rtcore/cpu_dma_latency.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace rtcore {

namespace {

std::string open_hint(int errnum) {
    switch (errnum) {
    case ENOENT:
        return " (kernel without PM QoS support: CPU idle states cannot be held off)";
    case EACCES:
    case EPERM:
        return " (the device is root-only: run as root, or give user qrtd alone write access, as the package's "
               "tmpfiles.d does with an ACL: systemd-tmpfiles --create qrtd.conf)";
    default:
        return "";
    }
}

}  // namespace

result<cpu_dma_latency_hold> cpu_dma_latency_hold::acquire(host_fs& fs, std::int32_t latency_us) {
    if (latency_us < 0) {
        return error::invalid("cpu_dma_latency: latency " + std::to_string(latency_us) + " us is negative");
    }
    char bytes[sizeof latency_us];
    std::memcpy(bytes, &latency_us, sizeof bytes);
    if (fs.dry_run()) {
        if (auto st = fs.write(cpu_dma_latency_path, std::string_view(bytes, sizeof bytes)); !st) {
            return std::move(st).err();
        }
        return cpu_dma_latency_hold{};
    }
    const auto path = fs.resolve(cpu_dma_latency_path);
    unique_fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) {
        const int e = errno;
        error err = error::from_errno(e, std::string("open ") + cpu_dma_latency_path);
        err.message += open_hint(e);
        return err;
    }
    const int raw = fd.get();
    cpu_dma_latency_hold hold(std::move(fd), latency_us);
    ssize_t n = -1;
    do {
        n = ::write(raw, bytes, sizeof bytes);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        const int err = errno;
        return error::from_errno(err, std::string("write ") + cpu_dma_latency_path + " (" + std::to_string(latency_us) +
                                 " us)");
    }
    if (n != static_cast<ssize_t>(sizeof bytes)) {
        return error{EIO, std::string("write ") + cpu_dma_latency_path + ": short write of " + std::to_string(n) +
                              " bytes"};
    }
    return hold;
}

result<std::int32_t> read_cpu_dma_latency_us(const host_fs& fs) {
    auto data = fs.read(cpu_dma_latency_path);
    if (!data) {
        return std::move(data).err();
    }
    if (data->size() < sizeof(std::int32_t)) {
        return error{EIO, std::string("read ") + cpu_dma_latency_path + ": " + std::to_string(data->size()) +
                              " bytes, expected a binary int32"};
    }
    std::int32_t v = 0;
    std::memcpy(&v, data->data(), sizeof v);
    return v;
}

}  // namespace rtcore
