// qpu-sim: a simulated QPU control endpoint speaking the qrt/proto/wire.h protocol.
//
// Version 1 (one phase): it timestamps each JOB on receipt (CLOCK_REALTIME),
// checks that the arrival lies inside the job's window, prepares it (the
// --prepare-* cost, zero by default), "runs" the job for its duration, and
// answers a RESULT with deterministic pseudo-random bitstring counts.
// Version 2 (when the agent's HELLO offers wire=2 and --wire is 2): ARM on
// the control connection is prepared ahead and answered ARMED, FIRE on the
// fire connection starts it (two_phase.hpp).  Faults can be
// injected (stall, drop, disconnect, slow answers, garbage) for every N-th
// job.  At exit (SIGTERM, SIGINT, --duration-s, --max-jobs) it prints the
// counters and arrival-lateness percentiles, as text or one JSON line.

#include <fcntl.h>
#include <sys/random.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qrt/proto/endpoint.hpp"
#include "qrt/proto/wire_codec.hpp"
#include "rtcore/histogram.hpp"
#include "rtcore/clock.hpp"
#include "two_phase.hpp"

namespace {

using rtcore::unique_fd;
using qpu_sim::bitstring_counts;
using qpu_sim::splitmix64;
namespace wire = qrt::wire;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

struct options {
    std::vector<std::string> listen;
    // The UNIX sockets' group and mode, set by qpu-sim itself (a caller
    // running as root never changes a path in a directory others can write).
    std::string socket_group;
    std::string socket_mode;
    std::optional<gid_t> gid;   // parsed from socket_group
    std::optional<mode_t> mode;  // parsed from socket_mode
    int cpu = -1;
    int fifo_priority = 0;
    double duration_s = 0;
    std::uint64_t max_jobs = 0;
    std::uint64_t calibration_id = 0;
    bool busy_poll = false;
    bool json = false;
    std::string summary_file;
    // One JSON line per job frame received, for tests that count what
    // reached the QPU (job id, calibration id); written as jobs arrive.
    std::string arrivals_file;
    // faults, for every N-th job (0 = never)
    std::uint64_t stall_every = 0;
    double stall_ms = 2000;
    std::uint64_t drop_every = 0;
    std::uint64_t disconnect_every = 0;
    std::uint64_t garbage_every = 0;
    std::uint64_t slow_every = 0;
    double slow_ms = 0;
    std::uint64_t stop_reading_after = 0;
    unsigned qubits = 4;
    // the wire: the highest version it answers (2: version 2 when offered)
    unsigned wire_version = 2;
    std::string prepare_dist = "fixed";
    qpu_sim::two_phase_options v2;
    double horizon_ms = 60'000;
    double min_lead_ms = -1;
    // calibration schedule printing
    bool print_calibration = false;
    double period_s = 1.0;
    double blackout_s = 0.1;
    double phase_s = 0.0;
    unsigned windows = 5;
};

struct counters {
    std::uint64_t connections = 0;
    std::uint64_t jobs = 0;
    std::uint64_t results = 0;
    std::uint64_t errors_sent = 0;
    std::uint64_t out_of_window = 0;
    std::uint64_t late = 0;
    std::uint64_t early = 0;
    std::uint64_t busy = 0;
    std::uint64_t calibration_mismatch = 0;
    std::uint64_t protocol_errors = 0;
    std::uint64_t dropped = 0;
    std::uint64_t stalled = 0;
    std::uint64_t disconnects = 0;
    std::uint64_t garbage = 0;
    std::uint64_t slow = 0;
    std::uint64_t control_connections = 0;
    std::uint64_t fire_connections = 0;
};

// What a connection is once its HELLO is read.
enum class conn_kind { fresh, v1, control, fire };

struct client {
    unique_fd fd;
    wire::frame_reader reader;
    conn_kind kind = conn_kind::fresh;
    bool reading = true;
    std::uint64_t id = 0;
    std::string session;          // control: its session
    std::uint64_t control_id = 0; // fire: its control connection
};

std::string new_session() {
    unsigned char b[16] = {};
    if (::getrandom(b, sizeof(b), 0) != static_cast<ssize_t>(sizeof(b))) {
        std::uint64_t s = static_cast<std::uint64_t>(rtcore::monotonic_now_ns());
        for (auto& x : b) {
            x = static_cast<unsigned char>(splitmix64(s));
        }
    }
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (const unsigned char x : b) {
        out += hex[x >> 4];
        out += hex[x & 15];
    }
    return out;
}

struct pending_answer {
    std::uint64_t client_id = 0;
    std::vector<std::uint8_t> bytes;
};

bool every(std::uint64_t n, std::uint64_t seq) { return n != 0 && seq % n == 0; }

// --socket-mode: octal permission bits, 0 to 0777.
bool parse_mode(const std::string& text, mode_t& out) {
    if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos) {
        return false;
    }
    const unsigned long v = std::stoul(text, nullptr, 8);
    if (v > 0777) {
        return false;
    }
    out = static_cast<mode_t>(v);
    return true;
}

// --socket-group: a group name or a numeric gid.
bool parse_group(const std::string& text, gid_t& out, std::string& why) {
    if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos && text.size() < 10) {
        out = static_cast<gid_t>(std::stoul(text));
        return true;
    }
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    const int rc = ::getgrnam_r(text.c_str(), &gr, buf.data(), buf.size(), &found);
    if (rc != 0) {
        why = "cannot look up group \"" + text + "\": " + std::strerror(rc);
        return false;
    }
    if (found == nullptr) {
        why = "no group \"" + text + "\"";
        return false;
    }
    out = gr.gr_gid;
    return true;
}

class simulator {
public:
    explicit simulator(options opt)
        : _opt(std::move(opt)),
          _v2(_opt.v2, [this](std::uint64_t id, std::vector<std::uint8_t> b) { send_to(id, b); },
              [this](std::int64_t due, std::uint64_t id, std::vector<std::uint8_t> b) {
                  _answers.emplace(due, pending_answer{id, std::move(b)});
              },
              _busy_until_mono, _start_lateness) {}

    int run() {
        if (!_opt.arrivals_file.empty()) {
            _arrivals.reset(std::fopen(_opt.arrivals_file.c_str(), "we"));
            if (_arrivals == nullptr) {
                std::fprintf(stderr, "qpu-sim: --arrivals-file %s: %s\n", _opt.arrivals_file.c_str(),
                             std::strerror(errno));
                return 2;
            }
        }
        for (const auto& uri : _opt.listen) {
            auto addr = qrt::proto::parse_endpoint(uri);
            if (!addr) {
                std::fprintf(stderr, "qpu-sim: %s\n", addr.err().message.c_str());
                return 2;
            }
            const bool unix_socket = addr->kind == qrt::proto::endpoint_kind::unix_stream;
            // The mode is the socket's from the moment it exists: bind
            // creates it under this umask, so nothing changes it afterwards.
            const mode_t old_umask = _opt.mode ? ::umask(static_cast<mode_t>(~*_opt.mode & 0777)) : 0;
            auto fd = qrt::proto::listen_endpoint(*addr);
            if (_opt.mode) {
                ::umask(old_umask);
            }
            if (!fd) {
                std::fprintf(stderr, "qpu-sim: %s\n", fd.err().message.c_str());
                return 1;
            }
            if (unix_socket && _opt.gid) {
                // lchown: what is at the path now, never a symlink's target.
                if (::fchownat(AT_FDCWD, addr->path.c_str(), static_cast<uid_t>(-1), *_opt.gid,
                               AT_SYMLINK_NOFOLLOW) != 0) {
                    std::fprintf(stderr, "qpu-sim: --socket-group: chown %s to gid %u: %s\n", addr->path.c_str(),
                                 static_cast<unsigned>(*_opt.gid), std::strerror(errno));
                    return 1;
                }
            }
            _listeners.push_back(std::move(*fd));
            _unix_paths.push_back(addr->kind == qrt::proto::endpoint_kind::unix_stream ? addr->path : "");
            std::fprintf(stderr, "qpu-sim: listening on %s\n", uri.c_str());
        }
        const std::int64_t start_mono = rtcore::monotonic_now_ns();
        const std::int64_t end_mono =
            _opt.duration_s > 0 ? start_mono + static_cast<std::int64_t>(_opt.duration_s * 1e9) : INT64_MAX;
        std::vector<pollfd> pfds;
        std::vector<std::uint64_t> pclients;
        while (g_stop == 0) {
            const std::int64_t now = rtcore::monotonic_now_ns();
            if (now >= end_mono ||
                (_opt.max_jobs != 0 && _c.jobs >= _opt.max_jobs && _answers.empty() && _v2.next_due() == INT64_MAX)) {
                break;
            }
            _v2.tick(now);
            flush_due(now);
            pfds.clear();
            pclients.clear();
            for (const auto& l : _listeners) {
                pfds.push_back({l.get(), POLLIN, 0});
                pclients.push_back(0);
            }
            for (const auto& [id, c] : _clients) {
                pfds.push_back({c->fd.get(), static_cast<short>(c->reading ? POLLIN : 0), 0});
                pclients.push_back(id);
            }
            std::int64_t wait_ns = std::min<std::int64_t>(end_mono - now, 100'000'000);
            if (!_answers.empty()) {
                wait_ns = std::min(wait_ns, std::max<std::int64_t>(0, _answers.begin()->first - now));
            }
            if (const std::int64_t due = _v2.next_due(); due != INT64_MAX) {
                wait_ns = std::min(wait_ns, std::max<std::int64_t>(0, due - now));
            }
            if (_opt.busy_poll) {
                wait_ns = 0;
            }
            timespec ts{wait_ns / 1'000'000'000, wait_ns % 1'000'000'000};
            const int n = ::ppoll(pfds.data(), pfds.size(), &ts, nullptr);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                std::perror("qpu-sim: ppoll");
                return 1;
            }
            for (std::size_t i = 0; i < pfds.size(); ++i) {
                if (pfds[i].revents == 0) {
                    continue;
                }
                if (i < _listeners.size()) {
                    accept_one(pfds[i].fd);
                } else {
                    service(pclients[i]);
                }
            }
        }
        for (const auto& p : _unix_paths) {
            if (!p.empty()) {
                ::unlink(p.c_str());
            }
        }
        report();
        _arrivals.reset();  // flushed and closed before the caller reads it
        return 0;
    }

private:
    void accept_one(int lfd) {
        const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            return;
        }
        auto c = std::make_unique<client>();
        c->fd.reset(fd);
        c->id = ++_next_client;
        ++_c.connections;
        _clients.emplace(c->id, std::move(c));
    }

    // A control connection takes its armed jobs (never started) and its
    // fire connection with it.
    void close_client(std::uint64_t id) {
        auto found = _clients.find(id);
        if (found != _clients.end() && found->second->kind == conn_kind::control) {
            _v2.on_control_closed(id);
            _sessions.erase(found->second->session);
            for (auto c = _clients.begin(); c != _clients.end();) {
                c = c->second->kind == conn_kind::fire && c->second->control_id == id ? _clients.erase(c)
                                                                                       : std::next(c);
            }
        }
        _clients.erase(id);
        for (auto it = _answers.begin(); it != _answers.end();) {
            it = it->second.client_id == id ? _answers.erase(it) : std::next(it);
        }
    }

    void send_now(client& c, const std::vector<std::uint8_t>& bytes) {
        std::size_t off = 0;
        while (off < bytes.size()) {
            const ssize_t n = ::send(c.fd.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                if (errno == EAGAIN) {
                    pollfd p{c.fd.get(), POLLOUT, 0};
                    ::poll(&p, 1, 100);
                    continue;
                }
                return;  // peer gone; the read side notices
            }
            off += static_cast<std::size_t>(n);
        }
    }

    void send_to(std::uint64_t id, const std::vector<std::uint8_t>& bytes) {
        auto it = _clients.find(id);
        if (it != _clients.end()) {
            send_now(*it->second, bytes);
            if (!bytes.empty() && wire::decode_header(bytes).hdr.type == QRT_WIRE_ERROR) {
                ++_c.errors_sent;
            }
        }
    }

    void flush_due(std::int64_t now) {
        while (!_answers.empty() && _answers.begin()->first <= now) {
            auto node = _answers.extract(_answers.begin());
            auto it = _clients.find(node.mapped().client_id);
            if (it != _clients.end()) {
                send_now(*it->second, node.mapped().bytes);
            }
        }
    }

    // In the connection's version (version 1 before its HELLO).
    void send_error(client& c, const wire::header& job, qrt_wire_error code, const std::string& why) {
        wire::header_v2 h = wire::header_v2_for(job, wire::frame_type::error);
        if (c.kind != conn_kind::control && c.kind != conn_kind::fire) {
            h.v1.version = 1;
            h.v1.header_len = wire::header_len;
        }
        h.v1.status = static_cast<std::uint16_t>(code);
        h.v1.arrival_ns = job.arrival_ns;
        h.v1.sent_ns = rtcore::realtime_now_ns();
        auto bytes = wire::encode_frame(h, why);
        if (c.kind == conn_kind::fire) {
            send_to(c.control_id, bytes);  // nothing is written on a fire connection
        } else {
            send_now(c, bytes);
        }
        ++_c.errors_sent;
    }

    void service(std::uint64_t id) {
        auto it = _clients.find(id);
        if (it == _clients.end()) {
            return;
        }
        client& c = *it->second;
        std::uint8_t buf[65536];
        const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
        const std::int64_t arrival_ns = rtcore::realtime_now_ns();
        const std::int64_t arrival_mono = rtcore::monotonic_now_ns();
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            close_client(id);
            return;
        }
        if (n < 0) {
            return;
        }
        c.reader.feed({buf, static_cast<std::size_t>(n)});
        while (auto f = c.reader.next()) {
            if (!handle(c, *f, arrival_ns, arrival_mono)) {
                close_client(id);
                return;
            }
        }
        if (c.reader.error() != wire::decode_status::ok) {
            ++_c.protocol_errors;
            wire::header none{};
            const auto code = c.reader.error() == wire::decode_status::bad_version ? QRT_WIRE_ERR_VERSION
                                                                                  : QRT_WIRE_ERR_PROTOCOL;
            send_error(c, none, code, std::string("protocol error: ") + wire::to_string(c.reader.error()));
            close_client(id);
        }
    }

    // The first frame: HELLO.  A version-1 HELLO offering wire=2 (with
    // --wire 2) opens a control connection, answered with the capabilities;
    // a version-2 HELLO naming a session opens its fire connection; any
    // other HELLO is answered in version 1.
    bool hello(client& c, const wire::frame& f) {
        if (f.hdr.type != QRT_WIRE_HELLO) {
            ++_c.protocol_errors;
            send_error(c, f.hdr, QRT_WIRE_ERR_PROTOCOL, "protocol error: first frame must be HELLO");
            return false;
        }
        const std::string identity = std::string("qpu-sim ") + QRT_VERSION;
        if (f.hdr.version == 2) {
            auto session = wire::parse_fire_hello(f.payload_text());
            auto ctl = session ? _sessions.find(*session) : _sessions.end();
            if (ctl == _sessions.end()) {
                ++_c.protocol_errors;
                send_error(c, f.hdr, QRT_WIRE_ERR_PROTOCOL,
                           session ? "protocol error: no control connection has that session"
                                   : "protocol error: " + session.err().message);
                return false;
            }
            c.kind = conn_kind::fire;
            c.control_id = ctl->second;
            ++_c.fire_connections;
            send_now(c, wire::encode_frame(wire::make_header_v2(wire::frame_type::hello),
                                           wire::fire_hello_json(*session)));
            return true;
        }
        if (_opt.wire_version >= 2 && wire::offers_v2(f.payload_text())) {
            c.kind = conn_kind::control;
            c.session = new_session();
            _sessions[c.session] = c.id;
            ++_c.control_connections;
            send_now(c, wire::encode_frame(wire::make_header_v2(wire::frame_type::hello),
                                           _v2.capabilities(identity, c.session)));
            return true;
        }
        c.kind = conn_kind::v1;
        send_now(c, wire::encode_frame(wire::make_header(wire::frame_type::hello), identity));
        return true;
    }

    // false: close the connection.
    bool handle(client& c, const wire::frame& f, std::int64_t arrival_ns, std::int64_t arrival_mono) {
        const auto type = static_cast<wire::frame_type>(f.hdr.type);
        if (c.kind == conn_kind::fresh) {
            return hello(c, f);
        }
        if (type == wire::frame_type::hello) {
            return true;  // harmless repeat
        }
        const unsigned version = c.kind == conn_kind::v1 ? 1U : 2U;
        if (f.hdr.version != version) {
            ++_c.protocol_errors;
            send_error(c, f.hdr, QRT_WIRE_ERR_VERSION,
                       "protocol error: a version-" + std::to_string(f.hdr.version) + " frame on a version-" +
                           std::to_string(version) + " connection");
            return false;
        }
        if (c.kind == conn_kind::control && (type == wire::frame_type::arm || type == wire::frame_type::disarm)) {
            if (type == wire::frame_type::arm) {
                ++_c.jobs;
                record_arrival(_c.jobs, f.hdr, arrival_ns, "ARM");
                _v2.on_arm(c.id, f, arrival_ns, arrival_mono);
            } else {
                record_arrival(_c.jobs, f.hdr, arrival_ns, "DISARM");
                _v2.on_disarm(c.id, f, arrival_ns);
            }
            return true;
        }
        if (c.kind == conn_kind::fire && type == wire::frame_type::fire) {
            record_arrival(_c.jobs, f.hdr, arrival_ns, "FIRE");
            _v2.on_fire(c.control_id, f, arrival_ns, arrival_mono);
            return true;
        }
        if (c.kind != conn_kind::v1 || type != wire::frame_type::job) {
            ++_c.protocol_errors;
            send_error(c, f.hdr, QRT_WIRE_ERR_PROTOCOL,
                       std::string("protocol error: unexpected frame type ") + wire::to_string(type));
            return false;
        }
        const std::uint64_t seq = ++_c.jobs;
        wire::header job = f.hdr;
        job.arrival_ns = arrival_ns;
        record_arrival(seq, job, arrival_ns, nullptr);
        const std::int64_t lateness_ns = arrival_ns - job.scheduled_ns;
        _lateness.record(lateness_ns);
        if (lateness_ns < 0) {
            ++_c.early;
        }
        if (_opt.stop_reading_after != 0 && seq >= _opt.stop_reading_after) {
            c.reading = false;  // the endpoint stalls: stop reading, never answer again
        }
        if (every(_opt.disconnect_every, seq)) {
            ++_c.disconnects;
            return false;
        }
        if (every(_opt.drop_every, seq)) {
            ++_c.dropped;
            return true;
        }
        if (every(_opt.garbage_every, seq)) {
            ++_c.garbage;
            std::vector<std::uint8_t> junk(64);
            std::uint64_t s = job.job_id;
            for (auto& b : junk) {
                b = static_cast<std::uint8_t>(splitmix64(s));
            }
            junk[0] = 'G';  // never a valid magic
            send_now(c, junk);
            return true;
        }
        const bool out_of_window =
            arrival_ns < job.window_start_ns || arrival_ns + job.duration_ns > job.window_end_ns;
        if (out_of_window) {
            ++_c.out_of_window;
            send_error(c, job, QRT_WIRE_ERR_OUT_OF_WINDOW,
                       "arrival " + std::to_string(arrival_ns) + " outside window [" +
                           std::to_string(job.window_start_ns) + ", " + std::to_string(job.window_end_ns) +
                           " - duration " + std::to_string(job.duration_ns) + "]");
            return true;
        }
        if (_opt.calibration_id != 0 && job.calibration_id != _opt.calibration_id) {
            ++_c.calibration_mismatch;
            send_error(c, job, QRT_WIRE_ERR_CALIBRATION,
                       "calibration_id " + std::to_string(job.calibration_id) + " is not current (" +
                           std::to_string(_opt.calibration_id) + ")");
            return true;
        }
        // One phase: the program is prepared as it arrives (the --prepare-*
        // cost, zero by default), then runs.  One job at a time: a job that
        // arrives while the previous one still runs waits for it (counted as
        // busy).
        const std::int64_t prepared_mono = arrival_mono + _opt.v2.prepare.draw(job.job_id, f.payload.size()).total_ns();
        std::int64_t start_mono = prepared_mono;
        if (prepared_mono < _busy_until_mono) {
            ++_c.busy;
            start_mono = _busy_until_mono;
        }
        _busy_until_mono = start_mono + std::max<std::int64_t>(job.duration_ns, 0);
        _start_lateness.record(arrival_ns + (start_mono - arrival_mono) - job.scheduled_ns);
        wire::header r = wire::header_for(job, wire::frame_type::result);
        r.arrival_ns = arrival_ns;
        if (job.tolerance_ns > 0 && lateness_ns > job.tolerance_ns) {
            r.flags |= QRT_WIRE_FLAG_LATE;
            ++_c.late;
        }
        std::int64_t due = _busy_until_mono;
        if (every(_opt.stall_every, seq)) {
            ++_c.stalled;
            due += static_cast<std::int64_t>(_opt.stall_ms * 1e6);
        }
        if (every(_opt.slow_every, seq) || (_opt.slow_every == 0 && _opt.slow_ms > 0)) {
            ++_c.slow;
            due += static_cast<std::int64_t>(_opt.slow_ms * 1e6);
        }
        const std::string data = (job.flags & QRT_WIRE_FLAG_NO_RESULT_DATA) != 0
                                     ? std::string()
                                     : bitstring_counts(job.job_id, job.calibration_id,
                                                        std::min<std::uint32_t>(job.shots, 1'000'000), _opt.qubits);
        r.sent_ns = rtcore::realtime_now_ns() + (due - rtcore::monotonic_now_ns());
        _answers.emplace(due, pending_answer{c.id, wire::encode_frame(r, data)});
        ++_c.results;
        return true;
    }

    // After the arrival stamp, so the stamp does not pay for the write.
    // Version 2's frames add "frame": "ARM" | "FIRE" | "DISARM".
    void record_arrival(std::uint64_t seq, const wire::header& job, std::int64_t arrival_ns, const char* frame) {
        if (_arrivals == nullptr) {
            return;
        }
        std::fprintf(_arrivals.get(),
                     "{\"seq\":%" PRIu64 ",\"job_id\":%" PRIu64 ",\"calibration_id\":%" PRIu64
                     ",\"scheduled_ns\":%" PRId64 ",\"sent_ns\":%" PRId64 ",\"arrival_ns\":%" PRId64 "%s%s%s}\n",
                     seq, static_cast<std::uint64_t>(job.job_id), static_cast<std::uint64_t>(job.calibration_id),
                     static_cast<std::int64_t>(job.scheduled_ns), static_cast<std::int64_t>(job.sent_ns),
                     static_cast<std::int64_t>(arrival_ns), frame != nullptr ? ",\"frame\":\"" : "",
                     frame != nullptr ? frame : "", frame != nullptr ? "\"" : "");
    }

    void report() const {
        const rtcore::histogram_summary s = _lateness.summary();
        const rtcore::histogram_summary st = _start_lateness.summary();
        nlohmann::json j = {
            {"tool", "qpu-sim"},
            {"connections", _c.connections},
            {"jobs", _c.jobs},
            {"results", _c.results},
            {"errors_sent", _c.errors_sent},
            {"out_of_window", _c.out_of_window},
            {"late", _c.late},
            {"early", _c.early},
            {"busy", _c.busy},
            {"calibration_mismatch", _c.calibration_mismatch},
            {"protocol_errors", _c.protocol_errors},
            {"faults",
             {{"dropped", _c.dropped},
              {"stalled", _c.stalled},
              {"disconnects", _c.disconnects},
              {"garbage", _c.garbage},
              {"slow", _c.slow}}},
            {"wire", _opt.wire_version},
            {"control_connections", _c.control_connections},
            {"fire_connections", _c.fire_connections},
            {"start_lateness_ns",
             {{"count", st.count},
              {"min", st.min_ns},
              {"p50", st.p50_ns},
              {"p95", st.p95_ns},
              {"p99", st.p99_ns},
              {"max", st.max_ns},
              {"mean", st.mean_ns}}},
            {"arrival_lateness_ns",
             {{"count", s.count},
              {"p50", s.p50_ns},
              {"p95", s.p95_ns},
              {"p99", s.p99_ns},
              {"p999", s.p999_ns},
              {"max", s.max_ns},
              {"mean", s.mean_ns},
              {"stddev", s.stddev_ns}}},
        };
        _v2.report(j);
        if (!_opt.summary_file.empty()) {
            std::ofstream(_opt.summary_file) << j.dump() << '\n';
        }
        if (_opt.json) {
            std::printf("%s\n", j.dump().c_str());
            return;
        }
        std::printf("qpu-sim: %" PRIu64 " jobs, %" PRIu64 " results, %" PRIu64 " errors sent, %" PRIu64
                    " connections\n",
                    _c.jobs, _c.results, _c.errors_sent, _c.connections);
        std::printf("  out-of-window %" PRIu64 "  late %" PRIu64 "  early %" PRIu64 "  busy %" PRIu64
                    "  calibration-mismatch %" PRIu64 "  protocol-errors %" PRIu64 "\n",
                    _c.out_of_window, _c.late, _c.early, _c.busy, _c.calibration_mismatch, _c.protocol_errors);
        std::printf("  faults: dropped %" PRIu64 "  stalled %" PRIu64 "  disconnects %" PRIu64 "  garbage %" PRIu64
                    "  slow %" PRIu64 "\n",
                    _c.dropped, _c.stalled, _c.disconnects, _c.garbage, _c.slow);
        std::printf("  arrival lateness (us): n=%" PRIu64 " p50 %.1f  p95 %.1f  p99 %.1f  p99.9 %.1f  max %.1f"
                    "  stddev %.1f\n",
                    s.count, static_cast<double>(s.p50_ns) / 1e3, static_cast<double>(s.p95_ns) / 1e3,
                    static_cast<double>(s.p99_ns) / 1e3, static_cast<double>(s.p999_ns) / 1e3,
                    static_cast<double>(s.max_ns) / 1e3, s.stddev_ns / 1e3);
    }

    struct file_closer {
        void operator()(std::FILE* f) const { std::fclose(f); }
    };

    options _opt;
    std::unique_ptr<std::FILE, file_closer> _arrivals;
    counters _c;
    rtcore::histogram _lateness;
    rtcore::histogram _start_lateness;  // when the program started - scheduled_ns
    std::int64_t _busy_until_mono = 0;
    qpu_sim::two_phase _v2;
    std::map<std::string, std::uint64_t> _sessions;  // control connections by session
    std::vector<unique_fd> _listeners;
    std::vector<std::string> _unix_paths;
    std::map<std::uint64_t, std::unique_ptr<client>> _clients;
    std::uint64_t _next_client = 0;
    std::multimap<std::int64_t, pending_answer> _answers;  // by monotonic due time
};

// Periodic calibration schedule: window k is valid from phase + k*period to
// phase + (k+1)*period - blackout, aligned to the next whole period.
int print_calibration(const options& opt) {
    const auto period_ns = static_cast<std::int64_t>(opt.period_s * 1e9);
    const auto blackout_ns = static_cast<std::int64_t>(opt.blackout_s * 1e9);
    const auto phase_ns = static_cast<std::int64_t>(opt.phase_s * 1e9);
    if (period_ns <= 0 || blackout_ns < 0 || blackout_ns >= period_ns) {
        std::fprintf(stderr, "qpu-sim: --period-s must be > 0 and --blackout-s in [0, period)\n");
        return 2;
    }
    const std::int64_t now = rtcore::realtime_now_ns();
    std::int64_t k0 = (now - phase_ns) / period_ns + 1;
    nlohmann::json windows = nlohmann::json::array();
    for (unsigned i = 0; i < opt.windows; ++i) {
        const std::int64_t k = k0 + i;
        const std::int64_t from = phase_ns + k * period_ns;
        windows.push_back({{"calibration_id", static_cast<std::uint64_t>(k)},
                           {"valid_from_ns", from},
                           {"valid_until_ns", from + period_ns - blackout_ns}});
    }
    std::printf("%s\n", nlohmann::json{{"windows", windows}}.dump().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    options opt;
    CLI::App app{"qpu-sim: simulated QPU control endpoint for qrtd (qrt/proto/wire.h protocol)"};
    app.footer(
        "Examples:\n"
        "  qpu-sim --listen unix:///run/qrtd/qpu0.sock\n"
        "  qpu-sim --listen tcp://127.0.0.1:7000 --duration-s 30 --json\n"
        "  qpu-sim --listen unix:///tmp/q.sock --disconnect-every 100 --garbage-every 150\n"
        "  qpu-sim --listen unix:///tmp/q.sock --wire 2 --prepare-ms 200 --prepare-ns-per-byte 15\n"
        "  qpu-sim --print-calibration --period-s 2 --blackout-s 0.2 --windows 3\n"
        "See qpu-sim(1).");
    app.add_option("--listen,-l", opt.listen, "endpoint to listen on: unix:///path or tcp://127.x.x.x:port (repeatable)");
    app.add_option("--socket-group", opt.socket_group,
                   "group of the UNIX sockets (a name or gid), set by qpu-sim right after bind");
    app.add_option("--socket-mode", opt.socket_mode,
                   "permission bits of the UNIX sockets, octal (e.g. 0660), set as bind creates them");
    app.add_option("--cpu", opt.cpu, "pin to this CPU");
    app.add_option("--fifo", opt.fifo_priority, "run SCHED_FIFO at this priority (1..99)")->check(CLI::Range(0, 99));
    app.add_option("--duration-s", opt.duration_s, "exit after this many seconds (0 = until SIGTERM/SIGINT)");
    app.add_option("--max-jobs", opt.max_jobs, "exit after this many jobs have been answered");
    app.add_option("--calibration-id", opt.calibration_id, "current calibration id; others get ERROR (0 = accept any)");
    app.add_flag("--busy-poll", opt.busy_poll, "spin on the sockets for tighter arrival stamps (burns a CPU)");
    app.add_flag("--json", opt.json, "print the exit summary as one JSON line");
    app.add_option("--summary-file", opt.summary_file, "also write the JSON summary to this file");
    app.add_option("--arrivals-file", opt.arrivals_file,
                   "write one JSON line per job frame received (seq, job_id, calibration_id, scheduled_ns, "
                   "arrival_ns); complete once qpu-sim has exited");
    app.add_option("--stall-every", opt.stall_every, "hold back the RESULT of every N-th job for --stall-ms");
    app.add_option("--stall-ms", opt.stall_ms, "stall length in ms (default 2000)");
    app.add_option("--drop-every", opt.drop_every, "never answer every N-th job");
    app.add_option("--disconnect-every", opt.disconnect_every, "close the connection on every N-th job");
    app.add_option("--garbage-every", opt.garbage_every, "answer every N-th job with garbage bytes");
    app.add_option("--slow-ms", opt.slow_ms, "delay answers by this many ms (all, or every --slow-every)");
    app.add_option("--slow-every", opt.slow_every, "only every N-th answer is slow");
    app.add_option("--stop-reading-after", opt.stop_reading_after, "stop reading the connection after N jobs");
    app.add_option("--qubits", opt.qubits, "bitstring width of results")->check(CLI::Range(1, 16));
    app.add_option("--wire", opt.wire_version,
                   "highest wire version to speak: 2 (default) answers an agent offering wire=2 with version 2, "
                   "1 always answers version 1")
        ->check(CLI::Range(1, 2));
    app.add_option("--prepare-ms", opt.v2.prepare.base_ms,
                   "prepare cost (compile, upload, arm) of each program, ms (default 0)")
        ->check(CLI::Range(0.0, 3'600'000.0));
    app.add_option("--prepare-dist", opt.prepare_dist, "fixed (default), uniform (+- --prepare-spread-ms) or "
                                                       "exponential (--prepare-ms + a mean of --prepare-spread-ms)");
    app.add_option("--prepare-spread-ms", opt.v2.prepare.spread_ms, "spread of the prepare cost, ms")
        ->check(CLI::Range(0.0, 3'600'000.0));
    app.add_option("--prepare-ns-per-byte", opt.v2.prepare.ns_per_byte,
                   "prepare cost per payload byte, ns (1 ms per 64 KiB: 15.2587890625)")
        ->check(CLI::Range(0.0, 1e6));
    app.add_option("--max-armed", opt.v2.max_armed, "version 2: jobs held armed at once (default 16)")
        ->check(CLI::Range(1U, 1U << 20));
    app.add_option("--horizon-ms", opt.horizon_ms, "version 2: how far ahead of fire_at an ARM is taken (default 60000)")
        ->check(CLI::Range(1.0, 86'400'000.0));
    app.add_option("--min-lead-ms", opt.min_lead_ms,
                   "version 2: the min_lead_ns its HELLO states (default: the largest prepare cost it can draw)");
    app.add_option("--refuse-marker", opt.v2.refuse_marker,
                   "version 2: refuse at ARM (program_refused, stage parse, with its line) a program containing this");
    app.add_flag("--print-calibration", opt.print_calibration, "print a periodic calibration schedule as JSON and exit");
    app.add_option("--period-s", opt.period_s, "calibration period (s)");
    app.add_option("--blackout-s", opt.blackout_s, "blackout at the end of each period (s)");
    app.add_option("--phase-s", opt.phase_s, "phase of the schedule (s)");
    app.add_option("--windows", opt.windows, "number of windows to print");
    CLI11_PARSE(app, argc, argv);

    if (opt.print_calibration) {
        return print_calibration(opt);
    }
    if (!qpu_sim::parse_dist(opt.prepare_dist, opt.v2.prepare.shape)) {
        std::fprintf(stderr, "qpu-sim: --prepare-dist \"%s\": give fixed, uniform or exponential\n",
                     opt.prepare_dist.c_str());
        return 2;
    }
    opt.v2.horizon_ns = static_cast<std::int64_t>(opt.horizon_ms * 1e6);
    opt.v2.min_lead_ns = opt.min_lead_ms < 0 ? -1 : static_cast<std::int64_t>(opt.min_lead_ms * 1e6);
    opt.v2.calibration_id = opt.calibration_id;
    opt.v2.qubits = opt.qubits;
    if (opt.listen.empty()) {
        std::fprintf(stderr, "qpu-sim: give at least one --listen endpoint (see --help)\n");
        return 2;
    }
    if (!opt.socket_mode.empty()) {
        mode_t m = 0;
        if (!parse_mode(opt.socket_mode, m)) {
            std::fprintf(stderr, "qpu-sim: --socket-mode \"%s\": give octal permission bits, 0 to 0777 (e.g. 0660)\n",
                         opt.socket_mode.c_str());
            return 2;
        }
        opt.mode = m;
    }
    if (!opt.socket_group.empty()) {
        gid_t g = 0;
        std::string why;
        if (!parse_group(opt.socket_group, g, why)) {
            std::fprintf(stderr, "qpu-sim: --socket-group: %s\n", why.c_str());
            return 2;
        }
        opt.gid = g;
    }
    if (opt.cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(static_cast<unsigned>(opt.cpu), &set);
        if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
            std::fprintf(stderr, "qpu-sim: sched_setaffinity cpu %d: %s\n", opt.cpu, std::strerror(errno));
            return 1;
        }
    }
    if (opt.fifo_priority > 0) {
        sched_param sp{};
        sp.sched_priority = opt.fifo_priority;
        if (::sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
            std::fprintf(stderr, "qpu-sim: sched_setscheduler SCHED_FIFO %d: %s\n", opt.fifo_priority,
                         std::strerror(errno));
            return 1;
        }
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    simulator sim(opt);
    return sim.run();
}
