#pragma once
// Holds a PM QoS CPU DMA latency request while alive (kernel contract,
// Documentation/power/pm_qos_interface.rst): open /dev/cpu_dma_latency,
// write the target as a binary int32 (microseconds), keep the fd open.  The
// kernel drops the request when the fd is closed, so this is RAII: the
// request lives exactly as long as the holder.
//
//   auto hold = rtcore::cpu_dma_latency_hold::acquire(fs);   // target 0 us
//   if (!hold) { log(hold.err().message); }                   // missing / denied
//
// The device path is resolved through host_fs, so tests point it at a file
// in a fake tree.  In a dry-run host_fs nothing is opened; the write is only
// recorded in planned_writes().

#include <cstdint>
#include <string>
#include <utility>

#include "rtcore/error.hpp"
#include "rtcore/host_fs.hpp"
#include "rtcore/unique_fd.hpp"

namespace rtcore {

inline constexpr const char* cpu_dma_latency_path = "/dev/cpu_dma_latency";

class cpu_dma_latency_hold {
public:
    // An empty holder (no request).
    cpu_dma_latency_hold() noexcept = default;

    static result<cpu_dma_latency_hold> acquire(host_fs& fs, std::int32_t latency_us = 0);

    cpu_dma_latency_hold(cpu_dma_latency_hold&& other) noexcept = default;
    cpu_dma_latency_hold& operator=(cpu_dma_latency_hold&& other) noexcept = default;
    cpu_dma_latency_hold(const cpu_dma_latency_hold&) = delete;
    cpu_dma_latency_hold& operator=(const cpu_dma_latency_hold&) = delete;
    ~cpu_dma_latency_hold() = default;

    // True while a request is held open (false for empty and dry-run holders).
    bool active() const noexcept { return _fd.valid(); }
    int fd() const noexcept { return _fd.get(); }
    std::int32_t latency_us() const noexcept { return _latency_us; }
    // Drop the request now (closes the fd).
    void release() noexcept { _fd.reset(); }

private:
    cpu_dma_latency_hold(unique_fd fd, std::int32_t latency_us) noexcept
        : _fd(std::move(fd)), _latency_us(latency_us) {}

    unique_fd _fd;
    std::int32_t _latency_us = 0;
};

// The current system-wide target in microseconds, read back from the device
// (the kernel answers a read with a binary int32).
result<std::int32_t> read_cpu_dma_latency_us(const host_fs& fs);

}  // namespace rtcore
