#pragma once
// Durable ledger store: SQLite in WAL mode, one transaction per ledger
// operation, committed before the operation returns (so the socket layer
// acknowledges only what is on disk).
//
// synchronous=FULL: in WAL mode, NORMAL survives a process crash (kill -9)
// but may lose the last commits on power loss or a kernel crash, because the
// WAL is only synced at checkpoints.  An acknowledged reservation must survive
// both, so every commit syncs the WAL.  The cost is one fdatasync per
// operation on the housekeeping loop, not on the real-time path.
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

// RAII over sqlite3*.
class sqlite_db {
public:
    sqlite_db() = default;
    explicit sqlite_db(sqlite3* db) noexcept : _db(db) {}
    sqlite_db(const sqlite_db&) = delete;
    sqlite_db& operator=(const sqlite_db&) = delete;
    sqlite_db(sqlite_db&& o) noexcept : _db(o._db) { o._db = nullptr; }
    sqlite_db& operator=(sqlite_db&& o) noexcept;
    ~sqlite_db();
    sqlite3* get() const noexcept { return _db; }

private:
    sqlite3* _db = nullptr;
};

// RAII over sqlite3_stmt*; reset after every use.
class sqlite_stmt {
public:
    sqlite_stmt() = default;
    explicit sqlite_stmt(sqlite3_stmt* s) noexcept : _s(s) {}
    sqlite_stmt(const sqlite_stmt&) = delete;
    sqlite_stmt& operator=(const sqlite_stmt&) = delete;
    sqlite_stmt(sqlite_stmt&& o) noexcept : _s(o._s) { o._s = nullptr; }
    sqlite_stmt& operator=(sqlite_stmt&& o) noexcept;
    ~sqlite_stmt();
    sqlite3_stmt* get() const noexcept { return _s; }

private:
    sqlite3_stmt* _s = nullptr;
};

struct stored_state {
    std::vector<reservation> reservations;
    std::vector<std::pair<std::string, calibration_window>> windows;  // pushed QPUs only
    std::uint64_t next_id = 1;
    std::uint64_t next_token = 1;
    std::uint64_t next_gang = 1;
};

class store {
public:
    static constexpr int k_schema_version = 2;

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
    status put_counters(std::uint64_t next_id, std::uint64_t next_token, std::uint64_t next_gang);
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
    sqlite_stmt _begin;
    sqlite_stmt _commit;
    sqlite_stmt _rollback;
};

}  // namespace qrt::timeline
