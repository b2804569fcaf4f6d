#pragma once
// Lock-free single-producer, single-consumer ring of trivially copyable T.
//
// The housekeeping side pushes job descriptors to a dispatch thread and the
// dispatch thread pushes its records back through a second ring (see
// README.md, "Threads and cores").  Exactly one thread may call the producer
// side (try_push, free_approx) and exactly one thread the consumer side
// (try_pop, peek, pop_front); any thread may read capacity().
//
// - Capacity is a power of two fixed at construction; the storage is
//   allocated once, in the constructor, and never again.  All slots are
//   usable (a ring of capacity 8 holds 8 items).
// - try_push / try_pop / peek are noexcept, never allocate, never block and
//   never take a lock, so they may run on the real-time thread.
// - Indices are free-running 64-bit counters (they never wrap in practice),
//   masked into the storage.  Producer and consumer indices live on separate
//   cache lines, each next to the owning side's cached copy of the other
//   index, so the sides only touch each other's line when the cache says the
//   ring looks full (producer) or empty (consumer).
// - Ordering: the producer writes the slot, then publishes the new write
//   index with a release store; the consumer reads the write index with an
//   acquire load before reading the slot, and symmetrically for the read
//   index, so a slot is never reused before it was copied out.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace rtcore {

// Cache-line size assumed for false-sharing separation (x86-64, most arm64).
inline constexpr std::size_t cache_line_bytes = 64;

template <typename T>
class spsc_ring {
    static_assert(std::is_trivially_copyable_v<T>, "spsc_ring<T> copies T with plain stores");
    static_assert(std::is_default_constructible_v<T>, "spsc_ring<T> preallocates T[]");

public:
    using value_type = T;

    // Setup code (may throw): capacity must be a power of two >= 1.
    explicit spsc_ring(std::size_t capacity)
        : _mask(check_capacity(capacity) - 1), _slots(std::make_unique<T[]>(capacity)) {}

    spsc_ring(const spsc_ring&) = delete;
    spsc_ring& operator=(const spsc_ring&) = delete;
    spsc_ring(spsc_ring&&) = delete;
    spsc_ring& operator=(spsc_ring&&) = delete;
    ~spsc_ring() = default;

    std::size_t capacity() const noexcept { return _mask + 1; }
    // The slot storage (capacity() items), for locking it in memory.
    const void* storage() const noexcept { return _slots.get(); }
    std::size_t storage_bytes() const noexcept { return capacity() * sizeof(T); }

    // Producer: copy item in; false (and nothing changed) when the ring is full.
    bool try_push(const T& item) noexcept {
        const std::uint64_t w = _prod.write.load(std::memory_order_relaxed);
        if (w - _prod.read_cache >= capacity()) {
            _prod.read_cache = _cons.read.load(std::memory_order_acquire);
            if (w - _prod.read_cache >= capacity()) {
                return false;
            }
        }
        _slots[static_cast<std::size_t>(w) & _mask] = item;
        _prod.write.store(w + 1, std::memory_order_release);
        return true;
    }

    // Consumer: the oldest item, or nullopt when the ring is empty.
    std::optional<T> try_pop() noexcept {
        const T* front = peek();
        if (front == nullptr) {
            return std::nullopt;
        }
        std::optional<T> out{*front};
        pop_front();
        return out;
    }

    // Consumer: pointer to the oldest item without removing it, or nullptr
    // when empty.  Valid until pop_front() or try_pop() by the same consumer.
    const T* peek() noexcept {
        const std::uint64_t r = _cons.read.load(std::memory_order_relaxed);
        if (r == _cons.write_cache) {
            _cons.write_cache = _prod.write.load(std::memory_order_acquire);
            if (r == _cons.write_cache) {
                return nullptr;
            }
        }
        return &_slots[static_cast<std::size_t>(r) & _mask];
    }

    // Consumer: drop the item peek() returned.  Precondition: peek() != nullptr.
    void pop_front() noexcept {
        const std::uint64_t r = _cons.read.load(std::memory_order_relaxed);
        _cons.read.store(r + 1, std::memory_order_release);
    }

    // Approximate fill level; exact when called by either side while the other
    // side is idle.  Any thread.
    std::size_t size_approx() const noexcept {
        const std::uint64_t r = _cons.read.load(std::memory_order_acquire);
        const std::uint64_t w = _prod.write.load(std::memory_order_acquire);
        return w >= r ? static_cast<std::size_t>(w - r) : 0;
    }
    bool empty_approx() const noexcept { return size_approx() == 0; }

    // Total items ever pushed / popped (monotonic; for telemetry).  Any thread.
    std::uint64_t pushed_total() const noexcept { return _prod.write.load(std::memory_order_acquire); }
    std::uint64_t popped_total() const noexcept { return _cons.read.load(std::memory_order_acquire); }

private:
    static std::size_t check_capacity(std::size_t capacity) {
        if (capacity == 0 || (capacity & (capacity - 1)) != 0) {
            throw std::invalid_argument("spsc_ring: capacity " + std::to_string(capacity) +
                                        " is not a power of two >= 1");
        }
        return capacity;
    }

    struct alignas(cache_line_bytes) producer_side {
        std::atomic<std::uint64_t> write{0};
        std::uint64_t read_cache = 0;  // producer's last view of consumer's read
    };
    struct alignas(cache_line_bytes) consumer_side {
        std::atomic<std::uint64_t> read{0};
        std::uint64_t write_cache = 0;  // consumer's last view of producer's write
    };

    producer_side _prod;
    consumer_side _cons;
    alignas(cache_line_bytes) const std::size_t _mask;
    const std::unique_ptr<T[]> _slots;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "spsc_ring needs lock-free 64-bit atomics");

}  // namespace rtcore
