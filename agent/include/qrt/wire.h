/* QPU endpoint wire format: the ONE header shared by qrtd (agent/) and the
 * tools (qpu-sim, tests, benches).  See README.md, "The QPU endpoint wire format".
 *
 * A frame is a fixed 96-byte header followed by payload_len bytes of payload.
 * Every field is a fixed-width little-endian integer; the header is
 * self-delimiting (header_len + payload_len = frame length), so a reader on a
 * byte stream needs nothing else to find the next frame.
 *
 * Times are integer nanoseconds since the Unix epoch (CLOCK_REALTIME, UTC),
 * durations are nanoseconds.
 *
 *   HELLO   either side, first frame on a connection.  version must match.
 *           payload: UTF-8 identity ("qrtd 0.1.0 qpu=0"), at most 256 bytes.
 *   JOB     agent -> QPU.  job_id, calibration_id, scheduled_ns (slot start),
 *           sent_ns (when the agent submitted it), window_start_ns and
 *           window_end_ns (the job must start at or after window_start_ns
 *           and end by window_end_ns), duration_ns, shots, tolerance_ns
 *           (largest acceptable arrival lateness).  payload: the program.
 *   RESULT  QPU -> agent.  Echoes the JOB's job fields (job_id,
 *           calibration_id, scheduled_ns, window, duration_ns, shots,
 *           tolerance_ns; qrt::wire::header_for); arrival_ns is when the
 *           QPU received the JOB, sent_ns when it answered.  payload: result data (qpu-sim: "<bitstring> <count>\n"
 *           lines for the shots).
 *   ERROR   QPU -> agent (or either side on a protocol error).  Echoes the
 *           JOB it answers as RESULT does (zeros when it answers none);
 *           status holds a qrt_wire_error code, payload a UTF-8 reason.
 *
 * C and C++ compatible: C code includes this file; C++ code includes
 * qrt/wire.hpp for the validating encode/decode helpers.
 */
#ifndef QRT_WIRE_H
#define QRT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define QRT_WIRE_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
extern "C" {
#else
#define QRT_WIRE_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define QRT_WIRE_MAGIC 0x57545251u /* "QRTW" as little-endian bytes */
#define QRT_WIRE_VERSION 1u
#define QRT_WIRE_HEADER_LEN 96u
/* Largest payload either side accepts (1 MiB); a larger payload_len is a
 * protocol error, never an allocation. */
#define QRT_WIRE_MAX_PAYLOAD (1u << 20)
#define QRT_WIRE_MAX_HELLO_PAYLOAD 256u

enum qrt_wire_type {
    QRT_WIRE_HELLO = 1,
    QRT_WIRE_JOB = 2,
    QRT_WIRE_RESULT = 3,
    QRT_WIRE_ERROR = 4,
};

/* flags (bit set) */
enum qrt_wire_flag {
    /* JOB: the agent asks for no RESULT payload (counts only). */
    QRT_WIRE_FLAG_NO_RESULT_DATA = 1u << 0,
    /* RESULT: the QPU saw the arrival outside [window_start, window_end - duration]. */
    QRT_WIRE_FLAG_OUT_OF_WINDOW = 1u << 1,
    /* RESULT: arrival lateness exceeded tolerance_ns. */
    QRT_WIRE_FLAG_LATE = 1u << 2,
};
#define QRT_WIRE_FLAGS_KNOWN 0x07u

/* status of an ERROR frame */
enum qrt_wire_error {
    QRT_WIRE_ERR_NONE = 0,
    QRT_WIRE_ERR_PROTOCOL = 1,       /* malformed frame */
    QRT_WIRE_ERR_VERSION = 2,        /* version mismatch */
    QRT_WIRE_ERR_OUT_OF_WINDOW = 3,  /* arrival outside the job's window; not run */
    QRT_WIRE_ERR_CALIBRATION = 4,    /* calibration_id is not the QPU's current one */
    QRT_WIRE_ERR_BUSY = 5,           /* the QPU was still running the previous job */
    QRT_WIRE_ERR_INTERNAL = 6,
};

struct qrt_wire_header {
    uint32_t magic;           /*  0 QRT_WIRE_MAGIC */
    uint16_t version;         /*  4 QRT_WIRE_VERSION */
    uint8_t type;             /*  6 enum qrt_wire_type */
    uint8_t flags;            /*  7 enum qrt_wire_flag bits */
    uint16_t header_len;      /*  8 QRT_WIRE_HEADER_LEN */
    uint16_t status;          /* 10 enum qrt_wire_error (ERROR), else 0 */
    uint32_t payload_len;     /* 12 bytes after the header */
    uint64_t job_id;          /* 16 */
    uint64_t calibration_id;  /* 24 */
    int64_t scheduled_ns;     /* 32 slot start, realtime */
    int64_t sent_ns;          /* 40 when this frame was submitted, realtime */
    int64_t window_start_ns;  /* 48 earliest acceptable arrival */
    int64_t window_end_ns;    /* 56 the job must end by this time */
    int64_t duration_ns;      /* 64 how long the job runs */
    int64_t arrival_ns;       /* 72 RESULT/ERROR: when the QPU received the JOB */
    uint32_t shots;           /* 80 */
    uint32_t reserved;        /* 84 must be 0 */
    int64_t tolerance_ns;     /* 88 largest acceptable arrival lateness */
};

QRT_WIRE_STATIC_ASSERT(sizeof(struct qrt_wire_header) == QRT_WIRE_HEADER_LEN, "wire header is 96 bytes");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, magic) == 0, "magic at 0");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, version) == 4, "version at 4");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, type) == 6, "type at 6");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, flags) == 7, "flags at 7");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, header_len) == 8, "header_len at 8");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, status) == 10, "status at 10");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, payload_len) == 12, "payload_len at 12");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, job_id) == 16, "job_id at 16");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, calibration_id) == 24, "calibration_id at 24");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, scheduled_ns) == 32, "scheduled_ns at 32");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, sent_ns) == 40, "sent_ns at 40");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, window_start_ns) == 48, "window_start_ns at 48");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, window_end_ns) == 56, "window_end_ns at 56");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, duration_ns) == 64, "duration_ns at 64");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, arrival_ns) == 72, "arrival_ns at 72");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, shots) == 80, "shots at 80");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, reserved) == 84, "reserved at 84");
QRT_WIRE_STATIC_ASSERT(offsetof(struct qrt_wire_header, tolerance_ns) == 88, "tolerance_ns at 88");

#ifdef __cplusplus
}
#endif

#endif /* QRT_WIRE_H */
