#pragma once
// Validating encode/decode for the QPU endpoint frames defined in qrt/proto/wire.h,
// versions 1 (one phase: JOB at T) and 2 (ARM ahead, FIRE at T).
//
// Header-only so qpu-sim and the tests use exactly the agent's code.
// - A frame's version and header length are its own (header.version,
//   header.header_len); decoded::hdr holds the fields every version has,
//   decoded::v2 the whole version-2 header (its v1 part equal to hdr; zero
//   past it for a version-1 frame).
// - encode_header()/patch_sent_ns() are noexcept and allocation-free: the
//   dispatch thread patches sent_ns into a frame prepared in advance.
// - decode_header() checks every field (magic, version, header_len, type,
//   flags, status, reserved, payload_len) and never reads past the span it is
//   given; a short span is need_more, not an error.
// - frame_reader cuts a byte stream into frames (housekeeping side; it
//   allocates).  After an error it stays in the error state: the stream is
//   out of sync and the connection must be dropped.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/proto/wire.h"

namespace qrt::wire {

using header = qrt_wire_header;
using header_v2 = qrt_wire_header_v2;
// Version 1's header length (the JOB frames the one-phase dispatch thread sends).
inline constexpr std::size_t header_len = QRT_WIRE_V1_HEADER_LEN;
inline constexpr std::size_t header_len_v2 = QRT_WIRE_V2_HEADER_LEN;
inline constexpr std::size_t max_header_len = QRT_WIRE_V2_HEADER_LEN;
inline constexpr std::uint32_t max_payload = QRT_WIRE_MAX_PAYLOAD;

// The header length of `version` (0 for a version the wire does not have).
constexpr std::size_t header_len_of(unsigned version) noexcept {
    return version == 1 ? QRT_WIRE_V1_HEADER_LEN : version == 2 ? QRT_WIRE_V2_HEADER_LEN : 0;
}
constexpr std::uint32_t max_hello_payload_of(unsigned version) noexcept {
    return version == 1 ? QRT_WIRE_V1_MAX_HELLO_PAYLOAD : version == 2 ? QRT_WIRE_V2_MAX_HELLO_PAYLOAD : 0;
}
static_assert(QRT_WIRE_VERSION_MAX == 2, "header_len_of and max_hello_payload_of know versions 1 and 2");

enum class frame_type : std::uint8_t {
    hello = QRT_WIRE_HELLO,
    job = QRT_WIRE_JOB,
    result = QRT_WIRE_RESULT,
    error = QRT_WIRE_ERROR,
    arm = QRT_WIRE_ARM,
    armed = QRT_WIRE_ARMED,
    fire = QRT_WIRE_FIRE,
    disarm = QRT_WIRE_DISARM,
    disarmed = QRT_WIRE_DISARMED,
};
static_assert(QRT_WIRE_TYPE_LAST == QRT_WIRE_DISARMED, "frame_type names every frame type of wire.h");

enum class decode_status {
    ok,
    need_more,          // fewer bytes than a header (or than header + payload)
    bad_magic,
    bad_version,
    bad_header_len,
    bad_type,
    bad_flags,
    bad_status,
    bad_reserved,
    payload_too_large,
    bad_stage,          // version 2: a stage past the table's, or a stage on a frame other than ERROR
    fire_has_payload,   // version 2: FIRE is a header only
};

// Stable spellings (they end up in job failure reasons).
inline const char* to_string(decode_status s) noexcept {
    switch (s) {
    case decode_status::ok: return "ok";
    case decode_status::need_more: return "need_more";
    case decode_status::bad_magic: return "bad_magic";
    case decode_status::bad_version: return "bad_version";
    case decode_status::bad_header_len: return "bad_header_len";
    case decode_status::bad_type: return "bad_type";
    case decode_status::bad_flags: return "bad_flags";
    case decode_status::bad_status: return "bad_status";
    case decode_status::bad_reserved: return "bad_reserved";
    case decode_status::payload_too_large: return "payload_too_large";
    case decode_status::bad_stage: return "bad_stage";
    case decode_status::fire_has_payload: return "fire_has_payload";
    }
    return "unknown";
}

inline const char* to_string(frame_type t) noexcept {
    switch (t) {
    case frame_type::hello: return "HELLO";
    case frame_type::job: return "JOB";
    case frame_type::result: return "RESULT";
    case frame_type::error: return "ERROR";
    case frame_type::arm: return "ARM";
    case frame_type::armed: return "ARMED";
    case frame_type::fire: return "FIRE";
    case frame_type::disarm: return "DISARM";
    case frame_type::disarmed: return "DISARMED";
    }
    return "?";
}

namespace detail {
template <typename T>
inline void store_le(std::uint8_t* p, T v) noexcept {
    auto u = static_cast<std::uint64_t>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) {
        p[i] = static_cast<std::uint8_t>(u >> (8 * i));
    }
}
template <typename T>
inline T load_le(const std::uint8_t* p) noexcept {
    std::uint64_t u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
        u |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    }
    return static_cast<T>(u);
}
}  // namespace detail

// A header with magic, version and header_len set and everything else zero.
inline header make_header(frame_type type) noexcept {
    header h{};
    h.magic = QRT_WIRE_MAGIC;
    h.version = QRT_WIRE_VERSION_MIN;
    h.type = static_cast<std::uint8_t>(type);
    h.header_len = QRT_WIRE_V1_HEADER_LEN;
    return h;
}

// A version-2 header: magic, version 2, header_len 128, everything else zero.
inline header_v2 make_header_v2(frame_type type) noexcept {
    header_v2 h{};
    h.v1 = make_header(type);
    h.v1.version = 2;
    h.v1.header_len = QRT_WIRE_V2_HEADER_LEN;
    return h;
}

// The header of a frame about one job, with every field that describes the
// job copied from `job`: job_id, calibration_id, scheduled_ns, the window,
// duration_ns, shots and tolerance_ns.  The agent builds its JOB from a
// dispatch_job (qrt/dispatch/job.hpp); a QPU builds its RESULT or ERROR from
// the JOB header it answers, so the answer echoes what was asked.  Whatever
// only the sender knows (flags, payload_len, sent_ns, arrival_ns, status) is
// left to the caller.
template <typename Job>
    requires requires(const Job& j) {
        j.job_id;
        j.calibration_id;
        j.scheduled_ns;
        j.window_start_ns;
        j.window_end_ns;
        j.duration_ns;
        j.shots;
        j.tolerance_ns;
    }
inline header header_for(const Job& job, frame_type type = frame_type::job) noexcept {
    header h = make_header(type);
    h.job_id = job.job_id;
    h.calibration_id = job.calibration_id;
    h.scheduled_ns = job.scheduled_ns;
    h.window_start_ns = job.window_start_ns;
    h.window_end_ns = job.window_end_ns;
    h.duration_ns = job.duration_ns;
    h.shots = job.shots;
    h.tolerance_ns = job.tolerance_ns;
    return h;
}

// header_for in version 2 (ARM, FIRE, DISARM; an endpoint's answers).
template <typename Job>
inline header_v2 header_v2_for(const Job& job, frame_type type) noexcept {
    header_v2 h{};
    h.v1 = header_for(job, type);
    h.v1.version = 2;
    h.v1.header_len = QRT_WIRE_V2_HEADER_LEN;
    return h;
}

// Writes h as 96 little-endian bytes at out (out must hold header_len bytes).
inline void encode_header(const header& h, std::uint8_t* out) noexcept {
    using detail::store_le;
    store_le(out + offsetof(header, magic), h.magic);
    store_le(out + offsetof(header, version), h.version);
    store_le(out + offsetof(header, type), h.type);
    store_le(out + offsetof(header, flags), h.flags);
    store_le(out + offsetof(header, header_len), h.header_len);
    store_le(out + offsetof(header, status), h.status);
    store_le(out + offsetof(header, payload_len), h.payload_len);
    store_le(out + offsetof(header, job_id), h.job_id);
    store_le(out + offsetof(header, calibration_id), h.calibration_id);
    store_le(out + offsetof(header, scheduled_ns), h.scheduled_ns);
    store_le(out + offsetof(header, sent_ns), h.sent_ns);
    store_le(out + offsetof(header, window_start_ns), h.window_start_ns);
    store_le(out + offsetof(header, window_end_ns), h.window_end_ns);
    store_le(out + offsetof(header, duration_ns), h.duration_ns);
    store_le(out + offsetof(header, arrival_ns), h.arrival_ns);
    store_le(out + offsetof(header, shots), h.shots);
    store_le(out + offsetof(header, reserved), h.reserved);
    store_le(out + offsetof(header, tolerance_ns), h.tolerance_ns);
}

// Writes h as 128 little-endian bytes at out (out must hold header_len_v2
// bytes); h.v1.version and header_len are written as they are.
inline void encode_header(const header_v2& h, std::uint8_t* out) noexcept {
    using detail::store_le;
    encode_header(h.v1, out);
    store_le(out + offsetof(header_v2, armed_ns), h.armed_ns);
    store_le(out + offsetof(header_v2, started_ns), h.started_ns);
    store_le(out + offsetof(header_v2, ended_ns), h.ended_ns);
    store_le(out + offsetof(header_v2, stage), h.stage);
    store_le(out + offsetof(header_v2, reserved2), h.reserved2);
    store_le(out + offsetof(header_v2, reserved3), h.reserved3);
    store_le(out + offsetof(header_v2, reserved4), h.reserved4);
}

// The dispatch thread stamps sent_ns into an encoded frame just before it
// submits it.
inline void patch_sent_ns(std::uint8_t* frame, std::int64_t sent_ns) noexcept {
    detail::store_le(frame + offsetof(header, sent_ns), sent_ns);
}

struct decoded {
    decode_status status = decode_status::need_more;
    header hdr{};    // the fields of every version
    header_v2 v2{};  // the whole version-2 header (v2.v1 == hdr); past v1, zero for a version-1 frame
};

// Parses and validates a header from the start of in: a version the wire
// has, that version's header_len, a type the version has, known flags, a
// status on ERROR only (version 1: its statuses up to internal), zero
// reserved fields, a payload within the wire's (or the version's HELLO)
// limit; version 2: a stage only on ERROR and one the table has, FIRE
// without payload.  A short span is need_more (a wrong magic, version or
// header_len is reported as soon as the 96 bytes of version 1 are there, a
// wrong magic as soon as its 4 bytes are).
inline decoded decode_header(std::span<const std::uint8_t> in) noexcept {
    using detail::load_le;
    decoded d;
    if (in.size() < header_len) {
        // Reject a wrong magic as soon as its 4 bytes are there: garbage is
        // reported without waiting for 96 bytes that may never come.
        if (in.size() >= sizeof(std::uint32_t) && load_le<std::uint32_t>(in.data()) != QRT_WIRE_MAGIC) {
            d.status = decode_status::bad_magic;
        }
        return d;
    }
    const std::uint8_t* p = in.data();
    header& h = d.hdr;
    h.magic = load_le<std::uint32_t>(p + offsetof(header, magic));
    h.version = load_le<std::uint16_t>(p + offsetof(header, version));
    h.type = load_le<std::uint8_t>(p + offsetof(header, type));
    h.flags = load_le<std::uint8_t>(p + offsetof(header, flags));
    h.header_len = load_le<std::uint16_t>(p + offsetof(header, header_len));
    h.status = load_le<std::uint16_t>(p + offsetof(header, status));
    h.payload_len = load_le<std::uint32_t>(p + offsetof(header, payload_len));
    h.job_id = load_le<std::uint64_t>(p + offsetof(header, job_id));
    h.calibration_id = load_le<std::uint64_t>(p + offsetof(header, calibration_id));
    h.scheduled_ns = load_le<std::int64_t>(p + offsetof(header, scheduled_ns));
    h.sent_ns = load_le<std::int64_t>(p + offsetof(header, sent_ns));
    h.window_start_ns = load_le<std::int64_t>(p + offsetof(header, window_start_ns));
    h.window_end_ns = load_le<std::int64_t>(p + offsetof(header, window_end_ns));
    h.duration_ns = load_le<std::int64_t>(p + offsetof(header, duration_ns));
    h.arrival_ns = load_le<std::int64_t>(p + offsetof(header, arrival_ns));
    h.shots = load_le<std::uint32_t>(p + offsetof(header, shots));
    h.reserved = load_le<std::uint32_t>(p + offsetof(header, reserved));
    h.tolerance_ns = load_le<std::int64_t>(p + offsetof(header, tolerance_ns));
    d.v2.v1 = h;

    if (h.magic != QRT_WIRE_MAGIC) {
        d.status = decode_status::bad_magic;
        return d;
    }
    if (h.version < QRT_WIRE_VERSION_MIN || h.version > QRT_WIRE_VERSION_MAX) {
        d.status = decode_status::bad_version;
        return d;
    }
    if (h.header_len != header_len_of(h.version)) {
        d.status = decode_status::bad_header_len;
        return d;
    }
    if (in.size() < h.header_len) {
        return d;  // need_more
    }
    header_v2& v = d.v2;
    if (h.version >= 2) {
        v.armed_ns = load_le<std::int64_t>(p + offsetof(header_v2, armed_ns));
        v.started_ns = load_le<std::int64_t>(p + offsetof(header_v2, started_ns));
        v.ended_ns = load_le<std::int64_t>(p + offsetof(header_v2, ended_ns));
        v.stage = load_le<std::uint8_t>(p + offsetof(header_v2, stage));
        v.reserved2 = load_le<std::uint8_t>(p + offsetof(header_v2, reserved2));
        v.reserved3 = load_le<std::uint16_t>(p + offsetof(header_v2, reserved3));
        v.reserved4 = load_le<std::uint32_t>(p + offsetof(header_v2, reserved4));
    }
    const unsigned since = qrt_wire_type_since(h.type);
    const unsigned last_status = h.version == 1 ? QRT_WIRE_ERR_INTERNAL : QRT_WIRE_ERR_LAST;
    if (since == 0 || since > h.version) {
        d.status = decode_status::bad_type;
    } else if ((h.flags & ~QRT_WIRE_FLAGS_KNOWN) != 0) {
        d.status = decode_status::bad_flags;
    } else if ((h.type == QRT_WIRE_ERROR) != (h.status != QRT_WIRE_ERR_NONE) || h.status > last_status) {
        d.status = decode_status::bad_status;
    } else if (h.reserved != 0 || v.reserved2 != 0 || v.reserved3 != 0 || v.reserved4 != 0) {
        d.status = decode_status::bad_reserved;
    } else if (v.stage > QRT_WIRE_STAGE_LAST || (v.stage != 0 && h.type != QRT_WIRE_ERROR)) {
        d.status = decode_status::bad_stage;
    } else if (h.payload_len > QRT_WIRE_MAX_PAYLOAD ||
               (h.type == QRT_WIRE_HELLO && h.payload_len > max_hello_payload_of(h.version))) {
        d.status = decode_status::payload_too_large;
    } else if (h.type == QRT_WIRE_FIRE && h.payload_len != 0) {
        d.status = decode_status::fire_has_payload;
    } else {
        d.status = decode_status::ok;
    }
    return d;
}

struct frame {
    header hdr{};    // as decoded::hdr
    header_v2 v2{};  // as decoded::v2
    std::vector<std::uint8_t> payload;

    std::string_view payload_text() const noexcept {
        return {reinterpret_cast<const char*>(payload.data()), payload.size()};
    }
};

// Whole frame (header + payload) as bytes.  Setup/housekeeping side.
inline std::vector<std::uint8_t> encode_frame(header h, std::span<const std::uint8_t> payload) {
    h.payload_len = static_cast<std::uint32_t>(payload.size());
    std::vector<std::uint8_t> out(header_len);
    encode_header(h, out.data());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

inline std::vector<std::uint8_t> encode_frame(header h, std::string_view payload) {
    return encode_frame(h, std::span<const std::uint8_t>(
                               reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()));
}

inline std::vector<std::uint8_t> encode_frame(header_v2 h, std::span<const std::uint8_t> payload) {
    h.v1.payload_len = static_cast<std::uint32_t>(payload.size());
    const bool v1 = h.v1.version == 1;
    std::vector<std::uint8_t> out(v1 ? header_len : header_len_v2);
    if (v1) {
        encode_header(h.v1, out.data());
    } else {
        encode_header(h, out.data());
    }
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

inline std::vector<std::uint8_t> encode_frame(header_v2 h, std::string_view payload) {
    return encode_frame(h, std::span<const std::uint8_t>(
                               reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()));
}

// Cuts a byte stream into frames.
class frame_reader {
public:
    // Appends received bytes.
    void feed(std::span<const std::uint8_t> bytes) { _buf.insert(_buf.end(), bytes.begin(), bytes.end()); }

    // The next complete frame, or nullopt when more bytes are needed or the
    // stream is broken (then error() != ok).
    std::optional<frame> next() {
        if (_error != decode_status::ok) {
            return std::nullopt;
        }
        const std::span<const std::uint8_t> avail(_buf.data() + _pos, _buf.size() - _pos);
        const decoded d = decode_header(avail);
        if (d.status == decode_status::need_more) {
            compact();
            return std::nullopt;
        }
        if (d.status != decode_status::ok) {
            _error = d.status;
            return std::nullopt;
        }
        const std::size_t hlen = d.hdr.header_len;
        const std::size_t total = hlen + d.hdr.payload_len;
        if (avail.size() < total) {
            compact();
            return std::nullopt;
        }
        frame f;
        f.hdr = d.hdr;
        f.v2 = d.v2;
        f.payload.assign(avail.begin() + static_cast<std::ptrdiff_t>(hlen),
                         avail.begin() + static_cast<std::ptrdiff_t>(total));
        _pos += total;
        return f;
    }

    decode_status error() const noexcept { return _error; }
    std::size_t buffered() const noexcept { return _buf.size() - _pos; }
    void reset() noexcept {
        _buf.clear();
        _pos = 0;
        _error = decode_status::ok;
    }

private:
    void compact() {
        if (_pos != 0) {
            _buf.erase(_buf.begin(), _buf.begin() + static_cast<std::ptrdiff_t>(_pos));
            _pos = 0;
        }
    }

    std::vector<std::uint8_t> _buf;
    std::size_t _pos = 0;
    decode_status _error = decode_status::ok;
};

}  // namespace qrt::wire
