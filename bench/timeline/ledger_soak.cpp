// qrt-ledger-soak: a busy QPU for 30 days in virtual time, on the production
// path (the real ledger and its SQLite store, every operation committed with
// the daemon's pragmas), and what that costs in memory and on disk.
//
//   qrt-ledger-soak                       # 30 days, a job every 100 ms, a push every 10 min
//   qrt-ledger-soak --days 2 --sample-hours 1
//
// Each job is submitted one-shot (place + commit, 1 s ahead, 50 ms long,
// --payload-bytes), dispatched at its start and completed at its end with a
// --result-bytes result.  Every --push-s the calibration stack pushes the next
// hour as six windows.  The daemon's housekeeping runs on its cadence:
// expire_leases and mark_missed every 100 ms, and every minute
// forget_terminal(now - retention), a WAL checkpoint and malloc_trim (as
// services.cpp does).  Every --sample-hours it prints RSS, the database size
// (file + WAL), the ledger's record, window and gap counts and the store's
// row counts; then ONE JSON line comparing the last sample with the first
// one after the warm-up (--warmup-h).  The database goes to --dir (default
// /dev/shm when writable: the figures are sizes, and fsync on a disk would
// make 30 days take hours).

#include <CLI/CLI.hpp>
#include <malloc.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qrt/timeline/ledger.hpp"

namespace {

using namespace qrt::timeline;
namespace fs = std::filesystem;

constexpr std::int64_t ms_ns = 1'000'000;
constexpr std::int64_t s_ns = 1'000 * ms_ns;
constexpr std::int64_t min_ns = 60 * s_ns;
constexpr std::int64_t hour_ns = 60 * min_ns;
constexpr std::int64_t t0_ns = 1'780'000'000 * s_ns;  // a weekday in 2026

struct params {
    double days = 30;
    std::int64_t job_interval_ms = 100;
    std::int64_t job_ms = 50;
    std::int64_t push_s = 600;
    std::int64_t retention_s = 3600;
    double sample_hours = 24;
    double warmup_h = 24;
    std::size_t payload_bytes = 256;
    std::size_t result_bytes = 1024;
    bool trim = true;
    std::size_t burst = 0;  // reserve/release cycles in one burst at burst_at_h
    double burst_at_h = 2;
    std::string dir;
};

std::int64_t status_kib(const char* field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    const std::string key = std::string(field) + ":";
    while (std::getline(in, line)) {
        if (line.rfind(key, 0) == 0) {
            return std::stoll(line.substr(key.size()));
        }
    }
    return -1;
}

std::int64_t file_bytes(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::int64_t>(st.st_size) : 0;
}

std::int64_t count_rows(const std::string& db, const char* table) {
    sqlite3* h = nullptr;
    std::int64_t n = -1;
    if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
        sqlite3_stmt* st = nullptr;
        const std::string q = std::string("SELECT COUNT(*) FROM ") + table;
        if (sqlite3_prepare_v2(h, q.c_str(), -1, &st, nullptr) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW) {
            n = sqlite3_column_int64(st, 0);
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(h);
    return n;
}

std::vector<calibration_window> next_hour(std::int64_t now_ns, std::int64_t push_ns) {
    const std::int64_t k = now_ns / push_ns;
    std::vector<calibration_window> ws;
    for (std::int64_t i = 0; i < 6; ++i) {
        const std::int64_t from = (k + i) * push_ns + 5 * s_ns;
        ws.push_back({static_cast<std::uint64_t>(k + i + 1), from, (k + i + 1) * push_ns,
                      0.99 - 0.001 * static_cast<double>((k + i) % 7), hour_ns});
    }
    return ws;
}

struct sample {
    double hours = 0;
    std::int64_t rss_kib = 0;
    std::int64_t heap_kib = 0;    // malloc'd and in use (mallinfo2)
    std::int64_t sqlite_kib = 0;  // SQLite's own, page cache included
    std::int64_t db_bytes = 0;
    std::int64_t wal_bytes = 0;
    std::size_t reservations = 0;
    std::size_t windows = 0;
    std::size_t gaps = 0;
    std::int64_t reservation_rows = 0;
    std::int64_t window_rows = 0;
    std::uint64_t jobs = 0;
    double wall_s = 0;
};

}  // namespace

int main(int argc, char** argv) {
    params p;
    CLI::App app{"A busy QPU for N days in virtual time: RSS and database size of the ledger"};
    app.add_option("--days", p.days, "virtual days")->capture_default_str()->check(CLI::Range(0.01, 365.0));
    app.add_option("--job-interval-ms", p.job_interval_ms, "one job every")->capture_default_str()->check(CLI::Range(1, 60'000));
    app.add_option("--job-ms", p.job_ms, "job duration")->capture_default_str()->check(CLI::Range(1, 60'000));
    app.add_option("--push-s", p.push_s, "calibration push interval (windows of this length)")
        ->capture_default_str()->check(CLI::Range(60, 86'400));
    app.add_option("--retention-s", p.retention_s, "timeline.retention_ns, in seconds")
        ->capture_default_str()->check(CLI::Range(1, 30 * 86'400));
    app.add_option("--sample-hours", p.sample_hours, "virtual hours between samples")->capture_default_str();
    app.add_option("--warmup-h", p.warmup_h, "virtual hours before the reference sample")->capture_default_str();
    app.add_option("--payload-bytes", p.payload_bytes, "payload per job")->capture_default_str();
    app.add_option("--result-bytes", p.result_bytes, "result per job")->capture_default_str();
    app.add_option("--dir", p.dir, "directory for the database (default /dev/shm or the temp dir)");
    app.add_option("--burst", p.burst, "reserve/release cycles in one burst (the issue's 100k case)")
        ->capture_default_str();
    app.add_option("--burst-at-h", p.burst_at_h, "virtual hour of the burst")->capture_default_str();
    bool no_trim = false;
    app.add_flag("--no-trim", no_trim, "skip malloc_trim after forgetting (what RSS does without it)");
    CLI11_PARSE(app, argc, argv);
    p.trim = !no_trim;

    const fs::path base = !p.dir.empty() ? fs::path(p.dir)
                          : ::access("/dev/shm", W_OK) == 0 ? fs::path("/dev/shm")
                                                            : fs::temp_directory_path();
    std::string tmpl = (base / "qrt-ledger-soak-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("mkdtemp");
        return 1;
    }
    const std::string db = (fs::path(tmpl) / "ledger.db").string();
    struct cleanup {
        std::string dir;
        ~cleanup() {
            std::error_code ec;
            fs::remove_all(dir, ec);
        }
    } cleanup_dir{tmpl};

    ledger_options o;  // the daemon's defaults (services.cpp ledger_options_for)
    o.policy = "edf-backfill";
    o.horizon_ns = 24 * hour_ns;
    o.min_lead_ns = 12'500'000;
    std::int64_t now = t0_ns;
    auto opened = ledger::open({qpu_spec{"qpu0", pushed_calibration{}}}, o, db, now);
    if (!opened) {
        std::fprintf(stderr, "ledger::open: %s\n", opened.err().message.c_str());
        return 1;
    }
    auto& l = **opened;

    const std::int64_t end = t0_ns + static_cast<std::int64_t>(p.days * 24.0 * static_cast<double>(hour_ns));
    const std::int64_t job_every = p.job_interval_ms * ms_ns;
    const std::int64_t push_ns = p.push_s * s_ns;
    const auto sample_every = static_cast<std::int64_t>(p.sample_hours * static_cast<double>(hour_ns));
    const std::vector<std::uint8_t> payload(p.payload_bytes, 0x5a);
    const std::vector<std::uint8_t> result_bytes(p.result_bytes, 0xa5);
    const auto wall0 = std::chrono::steady_clock::now();
    std::int64_t next_push = now;
    std::int64_t next_minute = now + min_ns;
    std::int64_t next_sample = now;
    std::uint64_t jobs = 0;
    std::uint64_t failures = 0;
    std::string first_failure;
    std::vector<sample> samples;
    const auto failed = [&](const error& e) {
        if (failures++ == 0) {
            first_failure = e.reason + ": " + e.message;
        }
    };
    // Jobs placed, waiting for their start (dispatch) and end (complete).
    struct inflight {
        std::uint64_t id;
        std::int64_t start_ns;
        std::int64_t end_ns;
        bool sent;
    };
    std::vector<inflight> pending;

    std::printf("%8s %9s %9s %8s %10s %9s %7s %7s %5s %9s %8s %10s %8s\n", "hours", "rss_kib",
                "heap_kib", "sql_kib", "db_bytes", "wal", "records", "windows", "gaps", "res_rows",
                "win_rows", "jobs", "wall_s");
    for (; now <= end; now += job_every) {
        if (now >= next_push) {
            if (auto u = l.update_calibration("qpu0", next_hour(now, push_ns), now); !u) {
                failed(u.err());
            }
            next_push += push_ns;
        }
        if (p.burst > 0 && now >= t0_ns + static_cast<std::int64_t>(p.burst_at_h * static_cast<double>(hour_ns))) {
            // A client reserving and releasing as fast as it can: the records
            // stay for the retention, then must go, and RSS with them.
            for (std::size_t i = 0; i < p.burst; ++i) {
                request b;
                b.duration_ns = ms_ns;
                b.not_before_ns = now + 2 * s_ns;
                b.qpus = {"qpu0"};
                auto r = l.reserve("burst", b, "burst-" + std::to_string(i), 0, now);
                if (!r) {
                    failed(r.err());
                    break;
                }
                if (auto rel = l.release("burst", r->id, r->fencing_token, now); !rel) {
                    failed(rel.err());
                }
                if (i % 1024 == 0) {
                    (void)l.drain_events();
                }
            }
            p.burst = 0;
        }
        // The dispatcher's side: sent at start, result at end.
        std::size_t keep = 0;
        for (inflight& j : pending) {
            if (!j.sent && j.start_ns <= now) {
                if (auto d = l.mark_dispatched(j.id, j.start_ns); !d) {
                    failed(d.err());
                }
                j.sent = true;
            }
            if (j.sent && j.end_ns <= now) {
                if (auto c = l.complete(j.id, blob(result_bytes), j.end_ns); !c) {
                    failed(c.err());
                }
                continue;
            }
            pending[keep++] = j;
        }
        pending.resize(keep);
        request rq;
        rq.duration_ns = p.job_ms * ms_ns;
        rq.not_before_ns = now + s_ns;
        rq.qpus = {"qpu0"};
        auto r = l.submit("tenant-" + std::to_string(jobs % 4), rq, "job-" + std::to_string(jobs),
                          blob(payload), now);
        ++jobs;
        if (r) {
            pending.push_back({r->id, r->start_ns, r->end_ns(), false});
        } else if (r.err().reason != reason::no_fit) {
            failed(r.err());  // no_fit: a blackout, the stack pushes late
        }
        // Housekeeping, as the daemon's timers: every 100 ms ...
        if (auto e = l.expire_leases(now); !e) {
            failed(e.err());
        }
        if (auto m = l.mark_missed(now, 2 * s_ns); !m) {
            failed(m.err());
        }
        (void)l.drain_events();
        // ... and every minute.
        if (now >= next_minute) {
            next_minute += min_ns;
            const auto before = l.stats();
            if (auto f = l.forget_terminal(now - p.retention_s * s_ns); !f) {
                failed(f.err());
            }
            if (auto c = l.checkpoint(); !c) {
                failed(c.err());
            }
            const auto after = l.stats();
            if (p.trim && after.reservations + after.windows < before.reservations + before.windows) {
                ::malloc_trim(0);
            }
        }
        if (now >= next_sample) {
            next_sample += sample_every;
            const auto st = l.stats();
            sample s;
            s.hours = static_cast<double>(now - t0_ns) / static_cast<double>(hour_ns);
            s.rss_kib = status_kib("VmRSS");
            s.heap_kib = static_cast<std::int64_t>(::mallinfo2().uordblks / 1024);
            s.sqlite_kib = static_cast<std::int64_t>(sqlite3_memory_used() / 1024);
            s.db_bytes = file_bytes(db);
            s.wal_bytes = file_bytes(db + "-wal");
            s.reservations = st.reservations;
            s.windows = st.windows;
            s.gaps = st.gaps;
            s.reservation_rows = count_rows(db, "reservations");
            s.window_rows = count_rows(db, "windows");
            s.jobs = jobs;
            s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
            samples.push_back(s);
            std::printf("%8.1f %9lld %9lld %8lld %10lld %9lld %7zu %7zu %5zu %9lld %8lld %10llu %8.1f\n",
                        s.hours, static_cast<long long>(s.rss_kib), static_cast<long long>(s.heap_kib),
                        static_cast<long long>(s.sqlite_kib), static_cast<long long>(s.db_bytes),
                        static_cast<long long>(s.wal_bytes), s.reservations, s.windows, s.gaps,
                        static_cast<long long>(s.reservation_rows), static_cast<long long>(s.window_rows),
                        static_cast<unsigned long long>(s.jobs), s.wall_s);
            std::fflush(stdout);
        }
    }
    if (samples.empty()) {
        std::fprintf(stderr, "no sample taken\n");
        return 1;
    }
    // The reference: the first sample at or after the warm-up.
    const sample* ref = &samples.back();
    for (const sample& s : samples) {
        if (s.hours >= p.warmup_h) {
            ref = &s;
            break;
        }
    }
    const sample& last = samples.back();
    std::int64_t peak_rss = 0;
    std::int64_t peak_db = 0;
    for (const sample& s : samples) {
        if (s.hours >= ref->hours) {
            peak_rss = std::max(peak_rss, s.rss_kib);
            peak_db = std::max(peak_db, s.db_bytes);
        }
    }
    const double rss_ratio = static_cast<double>(peak_rss) / static_cast<double>(std::max<std::int64_t>(1, ref->rss_kib));
    const double db_ratio = static_cast<double>(peak_db) / static_cast<double>(std::max<std::int64_t>(1, ref->db_bytes));
    // Flat: nothing after the warm-up above the reference by more than 5 %
    // (RSS moves by allocator pages; the database by free-list pages).
    const bool pass = failures == 0 && rss_ratio <= 1.05 && db_ratio <= 1.05 &&
                      last.reservation_rows == ref->reservation_rows && last.window_rows == ref->window_rows;
    std::printf("after the %.0f h warm-up: RSS %lld -> peak %lld KiB (%.3fx), database %lld -> peak %lld bytes "
                "(%.3fx), rows %lld/%lld -> %lld/%lld: %s\n",
                p.warmup_h, static_cast<long long>(ref->rss_kib), static_cast<long long>(peak_rss), rss_ratio,
                static_cast<long long>(ref->db_bytes), static_cast<long long>(peak_db), db_ratio,
                static_cast<long long>(ref->reservation_rows), static_cast<long long>(ref->window_rows),
                static_cast<long long>(last.reservation_rows), static_cast<long long>(last.window_rows),
                pass ? "PASS (flat)" : "FAIL");
    if (failures != 0) {
        std::printf("%llu operations failed; the first: %s\n", static_cast<unsigned long long>(failures),
                    first_failure.c_str());
    }
    std::printf("{\"bench\":\"timeline_ledger_soak\",\"days\":%g,\"job_interval_ms\":%lld,\"push_s\":%lld,"
                "\"retention_s\":%lld,\"trim\":%s,\"jobs\":%llu,\"failures\":%llu,"
                "\"ref_hours\":%g,\"ref_rss_kib\":%lld,\"last_rss_kib\":%lld,\"peak_rss_kib\":%lld,"
                "\"ref_heap_kib\":%lld,\"last_heap_kib\":%lld,\"last_sqlite_kib\":%lld,"
                "\"ref_db_bytes\":%lld,\"last_db_bytes\":%lld,\"peak_db_bytes\":%lld,"
                "\"rss_ratio\":%.4f,\"db_ratio\":%.4f,\"records\":%zu,\"windows\":%zu,\"gaps\":%zu,"
                "\"reservation_rows\":%lld,\"window_rows\":%lld,\"wall_s\":%.1f,\"pass\":%s}\n",
                p.days, static_cast<long long>(p.job_interval_ms), static_cast<long long>(p.push_s),
                static_cast<long long>(p.retention_s), p.trim ? "true" : "false",
                static_cast<unsigned long long>(jobs), static_cast<unsigned long long>(failures), ref->hours,
                static_cast<long long>(ref->rss_kib), static_cast<long long>(last.rss_kib),
                static_cast<long long>(peak_rss), static_cast<long long>(ref->heap_kib),
                static_cast<long long>(last.heap_kib), static_cast<long long>(last.sqlite_kib),
                static_cast<long long>(ref->db_bytes),
                static_cast<long long>(last.db_bytes), static_cast<long long>(peak_db), rss_ratio, db_ratio,
                last.reservations, last.windows, last.gaps, static_cast<long long>(last.reservation_rows),
                static_cast<long long>(last.window_rows), last.wall_s, pass ? "true" : "false");
    return pass ? 0 : 2;
}
