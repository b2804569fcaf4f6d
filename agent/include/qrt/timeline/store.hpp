#pragma once
// Durable ledger store: SQLite in WAL mode.  One transaction per group of
// ledger changes, written by the ledger's writer thread (commit_writer.hpp),
// or per operation before it returns without one; either way the socket
// layer acknowledges only what is on disk.  One thread uses a store at a
// time: the loop until start_writer, the writer after (the loop again only
// while the writer is parked, in recover()).
//
// synchronous=FULL: in WAL mode, NORMAL survives a process crash (kill -9)
// but may lose the last commits on power loss or a kernel crash, because the
// WAL is only synced at checkpoints.  An acknowledged reservation must survive
// both, so every commit syncs the WAL.  The cost is one fdatasync per group,
// on the writer thread, not on the event loop or the real-time path.
//
// Schema versioned by the schema_version table; migrations are applied in
// order inside one transaction on open.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/timeline/types.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace qrt::timeline {

// What closes each SQLite handle (sqlite3_close_v2, sqlite3_finalize).
void sqlite_release(sqlite3* db) noexcept;
void sqlite_release(sqlite3_stmt* s) noexcept;

// RAII over a SQLite handle (sqlite3*, sqlite3_stmt*): one owner, moved,
// released once.
template <typename T>
class sqlite_handle {
public:
    sqlite_handle() = default;
    explicit sqlite_handle(T* p) noexcept : _p(p) {}
    sqlite_handle(const sqlite_handle&) = delete;
    sqlite_handle& operator=(const sqlite_handle&) = delete;
    sqlite_handle(sqlite_handle&& o) noexcept : _p(o._p) { o._p = nullptr; }
    sqlite_handle& operator=(sqlite_handle&& o) noexcept {
        if (this != &o) {
            reset();
            _p = o._p;
            o._p = nullptr;
        }
        return *this;
    }
    ~sqlite_handle() { reset(); }
    T* get() const noexcept { return _p; }

private:
    void reset() noexcept {
        if (_p != nullptr) {
            sqlite_release(_p);
            _p = nullptr;
        }
    }
    T* _p = nullptr;
};

using sqlite_db = sqlite_handle<sqlite3>;
// A prepared statement; reset after every use.
using sqlite_stmt = sqlite_handle<sqlite3_stmt>;

struct stored_state {
    std::vector<reservation> reservations;
    std::vector<std::pair<std::string, calibration_window>> windows;  // pushed QPUs only
    std::vector<calibration_block> blocks;
    std::uint64_t next_id = 1;
    std::uint64_t next_gang = 1;
    std::uint64_t next_block = 1;
    // meta "dispatch_mark": jobs starting up to here may have been handed to
    // a dispatch thread (ledger::extend_dispatch_mark); 0 after a clean
    // close, so a job whose start passed while the agent was down is known
    // unsent only when its start is later than this.
    std::int64_t dispatch_mark_ns = 0;
};

class store {
public:
    static constexpr int k_schema_version = 4;

    // Opens or creates the database and applies pending migrations.
    static result<std::unique_ptr<store>> open(const std::string& path, int busy_timeout_ms = 2000);
    ~store();
    store(const store&) = delete;
    store& operator=(const store&) = delete;

    const std::string& path() const noexcept { return _path; }
    int schema_version() const noexcept { return _version; }

    result<stored_state> load();

    status begin();
    status commit();
    void rollback() noexcept;
    status put(const reservation& r);
    status erase(std::uint64_t id);
    // The id counters (fencing tokens are drawn at random: no counter; a
    // "next_token" row of an older store is ignored).
    status put_counters(std::uint64_t next_id, std::uint64_t next_gang, std::uint64_t next_block = 1);
    // One calibration block row, by id.
    status put_block(const calibration_block& b);
    status erase_block(std::uint64_t id);
    // meta "dispatch_mark" (stored_state::dispatch_mark_ns), in the open
    // transaction: raised to mark_ns (never lowered: marks written out of
    // order keep the highest), or set to 0 with reset.
    status put_dispatch_mark(std::int64_t mark_ns, bool reset = false);
    status replace_windows(const std::string& qpu, const std::vector<calibration_window>& windows);
    // One window row, by (qpu, calibration_id): the ledger writes only the
    // windows an operation changed, so a write costs the same however much
    // history the table holds.
    status put_window(const std::string& qpu, const calibration_window& w);
    status erase_window(const std::string& qpu, std::uint64_t calibration_id);
    // Copy the WAL into the database and truncate it to zero bytes (the
    // daemon calls this every minute, after forgetting old records).
    // Between calls SQLite checkpoints every 1000 pages and keeps the WAL
    // file at most k_wal_size_limit_bytes after each checkpoint.
    static constexpr std::int64_t k_wal_size_limit_bytes = 4 * 1024 * 1024;
    status checkpoint();

private:
    store() = default;
    status exec(std::string_view sql);
    result<sqlite_stmt> prepare(std::string_view sql);
    error sql_error(std::string_view what) const;
    status migrate();
    // One window row through `insert` (plain insert or upsert).
    status write_window(const sqlite_stmt& insert, const std::string& qpu,
                        const calibration_window& w);

    std::string _path;
    sqlite_db _db;
    int _version = 0;
    sqlite_stmt _put;
    sqlite_stmt _erase;
    sqlite_stmt _put_meta;
    sqlite_stmt _del_windows;
    sqlite_stmt _put_window;
    sqlite_stmt _upsert_window;
    sqlite_stmt _erase_window;
    sqlite_stmt _put_block;
    sqlite_stmt _erase_block;
    sqlite_stmt _begin;
    sqlite_stmt _commit;
    sqlite_stmt _rollback;
};

}  // namespace qrt::timeline
