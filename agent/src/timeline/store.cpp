#include "qrt/timeline/store.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <array>
#include <cstdint>

#include "rtcore/unique_fd.hpp"

namespace qrt::timeline {

void sqlite_release(sqlite3* db) noexcept { sqlite3_close_v2(db); }

void sqlite_release(sqlite3_stmt* s) noexcept { sqlite3_finalize(s); }

namespace {

// Migration i brings the schema from version i to i + 1.  Never edit one
// that shipped: append a new one.
constexpr std::array<std::string_view, store::k_schema_version> k_migrations = {
    // 0 -> 1: the ledger.
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
    "CREATE TABLE reservations("
    " id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, qpu TEXT NOT NULL,"
    " start_ns INTEGER NOT NULL, duration_ns INTEGER NOT NULL,"
    " not_before_ns INTEGER NOT NULL, deadline_ns INTEGER NOT NULL,"
    " priority INTEGER NOT NULL, min_fidelity REAL NOT NULL,"
    " calibration_id INTEGER NOT NULL, idempotency_key TEXT NOT NULL,"
    " lease_ns INTEGER NOT NULL, lease_expires_ns INTEGER NOT NULL,"
    " fencing_token INTEGER NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,"
    " gang_id INTEGER NOT NULL, payload BLOB, result BLOB, sent_ns INTEGER NOT NULL,"
    " created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL);"
    "CREATE TABLE windows(qpu TEXT NOT NULL, calibration_id INTEGER NOT NULL,"
    " valid_from_ns INTEGER NOT NULL, valid_until_ns INTEGER NOT NULL,"
    " f0 REAL NOT NULL, tau_ns INTEGER NOT NULL, PRIMARY KEY(qpu, calibration_id));",
    // 1 -> 2: idempotency lookups by (tenant, key) for tools reading the db.
    "CREATE INDEX reservations_idempotency ON reservations(tenant, idempotency_key)"
    " WHERE idempotency_key <> '';",
    // 2 -> 3: the shot count travels in the request (jobs.submit), not in the
    // payload.  A job stored before keeps the count the hand-over used to
    // read from its payload (a JSON object's positive integer "shots", at
    // most 1,000,000), read once here; else 0: the hand-over's default.
    "ALTER TABLE reservations ADD COLUMN shots INTEGER NOT NULL DEFAULT 0;"
    "UPDATE reservations SET shots = CASE WHEN json_valid(CAST(payload AS TEXT)) THEN"
    " (CASE WHEN json_type(CAST(payload AS TEXT)) = 'object'"
    " AND json_type(CAST(payload AS TEXT), '$.shots') = 'integer'"
    " AND json_extract(CAST(payload AS TEXT), '$.shots') > 0"
    " THEN MIN(json_extract(CAST(payload AS TEXT), '$.shots'), 1000000) ELSE 0 END) ELSE 0 END"
    " WHERE payload IS NOT NULL AND substr(payload, 1, 1) = CAST('{' AS BLOB);",
    // 3 -> 4: calibration blocks (calibration.request), and the block a
    // calibration service's job was placed in (0: none, as every job before).
    "CREATE TABLE calibration_blocks("
    " id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, qpu TEXT NOT NULL, step TEXT NOT NULL,"
    " start_ns INTEGER NOT NULL, duration_ns INTEGER NOT NULL, needed_by_ns INTEGER NOT NULL,"
    " urgency INTEGER NOT NULL, calibration_id INTEGER NOT NULL, state TEXT NOT NULL,"
    " reason TEXT NOT NULL, yield_deadline_ns INTEGER NOT NULL, idempotency_key TEXT NOT NULL,"
    " created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL);"
    "ALTER TABLE reservations ADD COLUMN block_id INTEGER NOT NULL DEFAULT 0;",
};

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

}  // namespace

error store::sql_error(std::string_view what) const {
    return make_error(reason::store_error, "sqlite " + std::string(what) + " on " + _path +
                                               ": " + sqlite3_errmsg(_db.get()));
}

status store::exec(std::string_view sql) {
    char* msg = nullptr;
    const int rc = sqlite3_exec(_db.get(), std::string(sql).c_str(), nullptr, nullptr, &msg);
    if (rc != SQLITE_OK) {
        std::string text = msg != nullptr ? msg : sqlite3_errstr(rc);
        sqlite3_free(msg);
        return make_error(reason::store_error,
                          "sqlite exec " + quoted(sql.substr(0, 60)) + " on " + _path + ": " + text);
    }
    return {};
}

result<sqlite_stmt> store::prepare(std::string_view sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v3(_db.get(), sql.data(), static_cast<int>(sql.size()),
                           SQLITE_PREPARE_PERSISTENT, &s, nullptr) != SQLITE_OK) {
        return sql_error("prepare " + quoted(sql.substr(0, 60)));
    }
    return sqlite_stmt(s);
}

namespace {

// The ledger holds every tenant's payloads and results, so the database and
// its -wal and -shm files are readable by the daemon's user only.  SQLite
// creates -wal and -shm with the database file's mode, so creating that one
// 0600 first covers new files; an older store (0644) is tightened in place.
status owner_only(const std::string& path) {
    const rtcore::unique_fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) {
        const int err = errno;
        return make_error(reason::store_error,
                          "open " + path + ": " + std::strerror(err));
    }
    struct stat st {};
    const bool loose = ::fstat(fd.get(), &st) == 0 && (st.st_mode & 077) != 0;
    const int rc = loose ? ::fchmod(fd.get(), 0600) : 0;
    const int err = errno;
    if (rc != 0) {
        return make_error(reason::store_error,
                          "fchmod 0600 " + path + ": " + std::strerror(err));
    }
    for (const char* suffix : {"-wal", "-shm"}) {
        const std::string side = path + suffix;
        const rtcore::unique_fd sfd(::open(side.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
        if (!sfd) {
            continue;  // not there yet: SQLite creates it 0600
        }
        struct stat sst {};
        if (::fstat(sfd.get(), &sst) == 0 && (sst.st_mode & 077) != 0 && ::fchmod(sfd.get(), 0600) != 0) {
            const int serr = errno;
            return make_error(reason::store_error,
                              "fchmod 0600 " + side + ": " + std::strerror(serr));
        }
    }
    return {};
}

}  // namespace

result<std::unique_ptr<store>> store::open(const std::string& path, int busy_timeout_ms) {
    std::unique_ptr<store> st(new store());
    st->_path = path;
    if (auto s = owner_only(path); !s) {
        return std::move(s).err();
    }
    sqlite3* db = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &db,
                                   SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                       SQLITE_OPEN_NOMUTEX,
                                   nullptr);
    st->_db = sqlite_db(db);  // closes it on every error path below
    if (rc != SQLITE_OK) {
        return make_error(reason::store_error, "sqlite3_open_v2 " + path + ": " +
                                                   (db != nullptr ? sqlite3_errmsg(db)
                                                                  : sqlite3_errstr(rc)));
    }
    sqlite3_busy_timeout(db, busy_timeout_ms);
    for (const std::string_view pragma :
         {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON",
          "PRAGMA wal_autocheckpoint=1000", "PRAGMA journal_size_limit=4194304",
          // The page cache, stated rather than left to the build's default:
          // at most 2 MiB of database pages stay in memory.
          "PRAGMA cache_size=-2048"}) {
        if (auto s = st->exec(pragma); !s) {
            return std::move(s).err();
        }
    }
    if (auto s = st->migrate(); !s) {
        return std::move(s).err();
    }
    struct named {
        sqlite_stmt* stmt;
        std::string_view sql;
    };
    const std::array<named, 12> stmts = {{
        {&st->_put,
         "INSERT OR REPLACE INTO reservations(id, tenant, qpu, start_ns, duration_ns,"
         " not_before_ns, deadline_ns, priority, min_fidelity, calibration_id,"
         " idempotency_key, lease_ns, lease_expires_ns, fencing_token, state, reason,"
         " gang_id, payload, result, sent_ns, created_ns, updated_ns, shots, block_id)"
         " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"},
        {&st->_put_block,
         "INSERT OR REPLACE INTO calibration_blocks(id, tenant, qpu, step, start_ns, duration_ns,"
         " needed_by_ns, urgency, calibration_id, state, reason, yield_deadline_ns,"
         " idempotency_key, created_ns, updated_ns) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"},
        {&st->_erase_block, "DELETE FROM calibration_blocks WHERE id = ?"},
        {&st->_erase, "DELETE FROM reservations WHERE id = ?"},
        {&st->_put_meta, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)"},
        {&st->_del_windows, "DELETE FROM windows WHERE qpu = ?"},
        {&st->_put_window,
         "INSERT INTO windows(qpu, calibration_id, valid_from_ns, valid_until_ns, f0, tau_ns)"
         " VALUES(?,?,?,?,?,?)"},
        {&st->_upsert_window,
         "INSERT OR REPLACE INTO windows(qpu, calibration_id, valid_from_ns, valid_until_ns,"
         " f0, tau_ns) VALUES(?,?,?,?,?,?)"},
        {&st->_erase_window, "DELETE FROM windows WHERE qpu = ? AND calibration_id = ?"},
        {&st->_begin, "BEGIN IMMEDIATE"},
        {&st->_commit, "COMMIT"},
        {&st->_rollback, "ROLLBACK"},
    }};
    for (const named& n : stmts) {
        auto s = st->prepare(n.sql);
        if (!s) {
            return std::move(s).err();
        }
        *n.stmt = std::move(*s);
    }
    return st;
}

store::~store() = default;

status store::checkpoint() {
    static_assert(k_wal_size_limit_bytes == 4194304, "the PRAGMA in open() says the same");
    int wal_frames = 0;
    int checkpointed = 0;
    const int rc = sqlite3_wal_checkpoint_v2(_db.get(), nullptr, SQLITE_CHECKPOINT_TRUNCATE,
                                             &wal_frames, &checkpointed);
    if (rc != SQLITE_OK) {
        return sql_error("wal_checkpoint(TRUNCATE)");
    }
    return {};
}

status store::migrate() {
    if (auto s = exec("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)"); !s) {
        return s;
    }
    auto sel = prepare("SELECT version FROM schema_version");
    if (!sel) {
        return std::move(sel).err();
    }
    int version = 0;
    bool have_row = false;
    if (sqlite3_step(sel->get()) == SQLITE_ROW) {
        version = sqlite3_column_int(sel->get(), 0);
        have_row = true;
    }
    if (version > k_schema_version) {
        return make_error(reason::store_error,
                          "store " + _path + " has schema_version " + std::to_string(version) +
                              ", newer than this qrtd understands (" +
                              std::to_string(k_schema_version) + ")");
    }
    if (version == k_schema_version) {
        _version = version;
        return {};
    }
    if (auto s = exec("BEGIN IMMEDIATE"); !s) {
        return s;
    }
    for (int v = version; v < k_schema_version; ++v) {
        if (auto s = exec(k_migrations[static_cast<std::size_t>(v)]); !s) {
            rollback();
            return make_error(reason::store_error, "migration " + std::to_string(v) + " -> " +
                                                       std::to_string(v + 1) + ": " +
                                                       s.err().message);
        }
    }
    const std::string set = have_row ? "UPDATE schema_version SET version = " +
                                           std::to_string(k_schema_version)
                                     : "INSERT INTO schema_version(version) VALUES(" +
                                           std::to_string(k_schema_version) + ")";
    if (auto s = exec(set); !s) {
        rollback();
        return s;
    }
    if (auto s = exec("COMMIT"); !s) {
        rollback();
        return s;
    }
    _version = k_schema_version;
    return {};
}

namespace {

struct stmt_use {
    sqlite3_stmt* s;
    explicit stmt_use(const sqlite_stmt& st) : s(st.get()) {}
    stmt_use(const stmt_use&) = delete;
    stmt_use& operator=(const stmt_use&) = delete;
    ~stmt_use() {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
    int bind(int i, std::int64_t v) { return sqlite3_bind_int64(s, i, v); }
    int bind_u(int i, std::uint64_t v) {
        return sqlite3_bind_int64(s, i, static_cast<sqlite3_int64>(v));
    }
    int bind(int i, double v) { return sqlite3_bind_double(s, i, v); }
    int bind(int i, std::string_view v) {
        return sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    }
    int bind(int i, const blob& v) {
        if (v.empty()) {
            return sqlite3_bind_zeroblob(s, i, 0);
        }
        return sqlite3_bind_blob(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    }
};

std::string column_text(sqlite3_stmt* s, int i) {
    const unsigned char* p = sqlite3_column_text(s, i);
    const int n = sqlite3_column_bytes(s, i);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p),
                                                      static_cast<std::size_t>(n));
}

blob column_blob(sqlite3_stmt* s, int i) {
    const auto* p = static_cast<const std::uint8_t*>(sqlite3_column_blob(s, i));
    const int n = sqlite3_column_bytes(s, i);
    return p == nullptr ? blob() : blob(p, p + n);
}

}  // namespace

status store::begin() {
    stmt_use u(_begin);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("BEGIN IMMEDIATE");
    }
    return {};
}

status store::commit() {
    stmt_use u(_commit);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("COMMIT");
    }
    return {};
}

void store::rollback() noexcept {
    if (sqlite3_get_autocommit(_db.get()) == 0) {
        sqlite3_exec(_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    }
}

status store::put(const reservation& r) {
    stmt_use u(_put);
    int rc = SQLITE_OK;
    int i = 0;
    auto b = [&](auto v) {
        if (rc == SQLITE_OK) {
            rc = u.bind(++i, v);
        }
    };
    rc = u.bind_u(++i, r.id);
    b(std::string_view(r.tenant));
    b(std::string_view(r.qpu));
    b(r.start_ns);
    b(r.duration_ns);
    b(r.not_before_ns);
    b(r.deadline_ns);
    b(static_cast<std::int64_t>(r.priority));
    b(r.min_fidelity);
    if (rc == SQLITE_OK) {
        rc = u.bind_u(++i, r.calibration_id);
    }
    b(std::string_view(r.idempotency_key));
    b(r.lease_ns);
    b(r.lease_expires_ns);
    if (rc == SQLITE_OK) {
        rc = u.bind_u(++i, r.fencing_token);
    }
    b(to_string(r.state));
    b(std::string_view(r.reason));
    if (rc == SQLITE_OK) {
        rc = u.bind_u(++i, r.gang_id);
    }
    if (rc == SQLITE_OK) {
        rc = u.bind(++i, r.payload);
    }
    if (rc == SQLITE_OK) {
        rc = u.bind(++i, r.result);
    }
    b(r.sent_ns);
    b(r.created_ns);
    b(r.updated_ns);
    if (rc == SQLITE_OK) {
        rc = u.bind_u(++i, r.shots);
    }
    if (rc == SQLITE_OK) {
        rc = u.bind_u(++i, r.block_id);
    }
    if (rc != SQLITE_OK) {
        return sql_error("bind reservation " + std::to_string(r.id));
    }
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("insert reservation " + std::to_string(r.id));
    }
    return {};
}

status store::erase(std::uint64_t id) {
    stmt_use u(_erase);
    u.bind_u(1, id);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("delete reservation " + std::to_string(id));
    }
    return {};
}

status store::put_counters(std::uint64_t next_id, std::uint64_t next_gang, std::uint64_t next_block) {
    const std::array<std::pair<std::string_view, std::uint64_t>, 3> rows = {
        {{"next_id", next_id}, {"next_gang", next_gang}, {"next_block", next_block}}};
    for (const auto& [key, value] : rows) {
        stmt_use u(_put_meta);
        u.bind(1, key);
        u.bind_u(2, value);
        if (sqlite3_step(u.s) != SQLITE_DONE) {
            return sql_error("update meta " + std::string(key));
        }
    }
    return {};
}

status store::put_block(const calibration_block& b) {
    stmt_use u(_put_block);
    int rc = u.bind_u(1, b.id);
    int i = 1;
    auto bind = [&](auto v) {
        if (rc == SQLITE_OK) {
            rc = u.bind(++i, v);
        }
    };
    bind(std::string_view(b.tenant));
    bind(std::string_view(b.qpu));
    bind(std::string_view(b.step));
    bind(b.start_ns);
    bind(b.duration_ns);
    bind(b.needed_by_ns);
    bind(static_cast<std::int64_t>(b.urgency));
    if (rc == SQLITE_OK) {
        rc = u.bind_u(++i, b.calibration_id);
    }
    bind(to_string(b.state));
    bind(std::string_view(b.reason));
    bind(b.yield_deadline_ns);
    bind(std::string_view(b.idempotency_key));
    bind(b.created_ns);
    bind(b.updated_ns);
    if (rc != SQLITE_OK) {
        return sql_error("bind calibration block " + std::to_string(b.id));
    }
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("insert calibration block " + std::to_string(b.id));
    }
    return {};
}

status store::erase_block(std::uint64_t id) {
    stmt_use u(_erase_block);
    u.bind_u(1, id);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("delete calibration block " + std::to_string(id));
    }
    return {};
}

status store::put_dispatch_mark(std::int64_t mark_ns, bool reset) {
    if (!reset) {
        auto sel = prepare("SELECT value FROM meta WHERE key = 'dispatch_mark'");
        if (!sel) {
            return std::move(sel).err();
        }
        if (sqlite3_step(sel->get()) == SQLITE_ROW &&
            sqlite3_column_int64(sel->get(), 0) >= mark_ns) {
            return {};
        }
    }
    stmt_use u(_put_meta);
    u.bind(1, std::string_view("dispatch_mark"));
    u.bind(2, reset ? std::int64_t{0} : mark_ns);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("update meta dispatch_mark");
    }
    return {};
}

status store::replace_windows(const std::string& qpu,
                              const std::vector<calibration_window>& windows) {
    {
        stmt_use u(_del_windows);
        u.bind(1, std::string_view(qpu));
        if (sqlite3_step(u.s) != SQLITE_DONE) {
            return sql_error("delete windows of " + qpu);
        }
    }
    for (const calibration_window& w : windows) {
        if (auto s = write_window(_put_window, qpu, w); !s) {
            return s;
        }
    }
    return {};
}

status store::put_window(const std::string& qpu, const calibration_window& w) {
    return write_window(_upsert_window, qpu, w);
}

status store::write_window(const sqlite_stmt& insert, const std::string& qpu,
                           const calibration_window& w) {
    stmt_use u(insert);
    u.bind(1, std::string_view(qpu));
    u.bind_u(2, w.calibration_id);
    u.bind(3, w.valid_from_ns);
    u.bind(4, w.valid_until_ns);
    u.bind(5, w.f0);
    u.bind(6, w.tau_ns);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("insert window " + std::to_string(w.calibration_id) + " of " + qpu);
    }
    return {};
}

status store::erase_window(const std::string& qpu, std::uint64_t calibration_id) {
    stmt_use u(_erase_window);
    u.bind(1, std::string_view(qpu));
    u.bind_u(2, calibration_id);
    if (sqlite3_step(u.s) != SQLITE_DONE) {
        return sql_error("delete window " + std::to_string(calibration_id) + " of " + qpu);
    }
    return {};
}

result<stored_state> store::load() {
    stored_state out;
    {
        auto sel = prepare("SELECT key, value FROM meta");
        if (!sel) {
            return std::move(sel).err();
        }
        while (sqlite3_step(sel->get()) == SQLITE_ROW) {
            const std::string key = column_text(sel->get(), 0);
            const auto value = static_cast<std::uint64_t>(sqlite3_column_int64(sel->get(), 1));
            if (key == "next_id") {
                out.next_id = value;
            } else if (key == "next_gang") {
                out.next_gang = value;
            } else if (key == "next_block") {
                out.next_block = value;
            } else if (key == "dispatch_mark") {
                out.dispatch_mark_ns = static_cast<std::int64_t>(value);
            }
        }
    }
    {
        auto sel = prepare(
            "SELECT id, tenant, qpu, start_ns, duration_ns, not_before_ns, deadline_ns,"
            " priority, min_fidelity, calibration_id, idempotency_key, lease_ns,"
            " lease_expires_ns, fencing_token, state, reason, gang_id, payload, result,"
            " sent_ns, created_ns, updated_ns, shots, block_id FROM reservations ORDER BY id");
        if (!sel) {
            return std::move(sel).err();
        }
        sqlite3_stmt* s = sel->get();
        int rc = 0;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            reservation r;
            r.id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 0));
            r.tenant = column_text(s, 1);
            r.qpu = column_text(s, 2);
            r.start_ns = sqlite3_column_int64(s, 3);
            r.duration_ns = sqlite3_column_int64(s, 4);
            r.not_before_ns = sqlite3_column_int64(s, 5);
            r.deadline_ns = sqlite3_column_int64(s, 6);
            r.priority = sqlite3_column_int(s, 7);
            r.min_fidelity = sqlite3_column_double(s, 8);
            r.calibration_id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 9));
            r.idempotency_key = column_text(s, 10);
            r.lease_ns = sqlite3_column_int64(s, 11);
            r.lease_expires_ns = sqlite3_column_int64(s, 12);
            r.fencing_token = static_cast<std::uint64_t>(sqlite3_column_int64(s, 13));
            const std::string state = column_text(s, 14);
            const auto st = res_state_from_string(state);
            if (!st) {
                return make_error(reason::store_error, "store " + _path + ": reservation " +
                                                           std::to_string(r.id) +
                                                           " has unknown state " + quoted(state));
            }
            r.state = *st;
            r.reason = column_text(s, 15);
            r.gang_id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 16));
            r.payload = column_blob(s, 17);
            r.result = column_blob(s, 18);
            r.sent_ns = sqlite3_column_int64(s, 19);
            r.created_ns = sqlite3_column_int64(s, 20);
            r.updated_ns = sqlite3_column_int64(s, 21);
            r.shots = static_cast<std::uint32_t>(std::clamp<std::int64_t>(sqlite3_column_int64(s, 22), 0, UINT32_MAX));
            r.block_id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 23));
            out.reservations.push_back(std::move(r));
        }
        if (rc != SQLITE_DONE) {
            return sql_error("select reservations");
        }
    }
    {
        auto sel = prepare(
            "SELECT qpu, calibration_id, valid_from_ns, valid_until_ns, f0, tau_ns FROM windows"
            " ORDER BY qpu, valid_from_ns");
        if (!sel) {
            return std::move(sel).err();
        }
        sqlite3_stmt* s = sel->get();
        while (sqlite3_step(s) == SQLITE_ROW) {
            calibration_window w;
            w.calibration_id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 1));
            w.valid_from_ns = sqlite3_column_int64(s, 2);
            w.valid_until_ns = sqlite3_column_int64(s, 3);
            w.f0 = sqlite3_column_double(s, 4);
            w.tau_ns = sqlite3_column_int64(s, 5);
            out.windows.emplace_back(column_text(s, 0), w);
        }
    }
    {
        auto sel = prepare(
            "SELECT id, tenant, qpu, step, start_ns, duration_ns, needed_by_ns, urgency,"
            " calibration_id, state, reason, yield_deadline_ns, idempotency_key, created_ns,"
            " updated_ns FROM calibration_blocks ORDER BY id");
        if (!sel) {
            return std::move(sel).err();
        }
        sqlite3_stmt* s = sel->get();
        int rc = 0;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            calibration_block b;
            b.id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 0));
            b.tenant = column_text(s, 1);
            b.qpu = column_text(s, 2);
            b.step = column_text(s, 3);
            b.start_ns = sqlite3_column_int64(s, 4);
            b.duration_ns = sqlite3_column_int64(s, 5);
            b.needed_by_ns = sqlite3_column_int64(s, 6);
            b.urgency = sqlite3_column_int(s, 7);
            b.calibration_id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 8));
            const std::string state = column_text(s, 9);
            const auto st = block_state_from_string(state);
            if (!st) {
                return make_error(reason::store_error, "store " + _path + ": calibration block " +
                                                           std::to_string(b.id) +
                                                           " has unknown state " + quoted(state));
            }
            b.state = *st;
            b.reason = column_text(s, 10);
            b.yield_deadline_ns = sqlite3_column_int64(s, 11);
            b.idempotency_key = column_text(s, 12);
            b.created_ns = sqlite3_column_int64(s, 13);
            b.updated_ns = sqlite3_column_int64(s, 14);
            out.blocks.push_back(std::move(b));
        }
        if (rc != SQLITE_DONE) {
            return sql_error("select calibration blocks");
        }
    }
    return out;
}

}  // namespace qrt::timeline
