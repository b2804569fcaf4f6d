/*
 * libqrt-client: the C interface to the qrtd control socket.
 *
 * For Slurm SPANK plugins, prolog/epilog helpers and any other C caller.
 * The library speaks JSON-RPC 2.0 over the agent's AF_UNIX stream socket
 * (default /run/qrtd/qrtd.sock, or $QRT_SOCKET); see qrtctl(1) for the
 * methods and their parameters.  A path "tcp://HOST:PORT"
 * reaches an agent's network listener on another node instead: the
 * library has the local munged encode a MUNGE credential ($QRT_MUNGE_SOCKET
 * names munged's socket) and authenticates before qrt_connect returns;
 * munged not running is reason "munge_error", a refused credential reason
 * "unauthenticated" (qrtd(8), NETWORK LISTENER).
 *
 *   qrt_client *c = NULL;
 *   qrt_error err;
 *   if (qrt_connect(NULL, &c, &err) < 0) { fprintf(stderr, "%s\n", err.message); ... }
 *   char *hello = NULL;
 *   if (qrt_call(c, "agent.hello", NULL, &hello, &err) == 0) { puts(hello); qrt_free(hello); }
 *   qrt_close(c);
 *
 * Conventions (after liburing):
 *   - every int-returning call returns 0 on success or a NEGATIVE errno
 *     value; errno itself is never the channel;
 *   - -EREMOTEIO means the agent answered with an error: err->code is the
 *     JSON-RPC code and err->reason its stable data.reason (e.g. "no_fit");
 *   - other negative values are local: -ECONNREFUSED/-ENOENT (agent not
 *     running), -ETIMEDOUT (no reply within the timeout), -ECONNRESET
 *     (the agent closed the connection), -EPROTO (a reply that is not
 *     JSON-RPC), -EINVAL (bad arguments), -ENOMEM;
 *   - err may be NULL; when given, it is filled on every failure;
 *   - strings returned through char ** are NUL-terminated JSON text owned
 *     by the caller, freed with qrt_free();
 *   - no C++ exception ever crosses this interface.
 *
 * A qrt_client is not thread-safe: use one per thread.  Every wait is
 * bounded by the client's timeout (qrt_set_timeout; default 5000 ms).
 *
 * ABI: the shared object's SONAME carries QRT_CLIENT_SOVERSION.  Structs
 * the caller allocates (qrt_error, qrt_slot_request, qrt_reservation) only
 * change together with the SOVERSION.
 */
#ifndef QRT_CLIENT_H
#define QRT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define QRT_CLIENT_API __attribute__((visibility("default")))
#else
#define QRT_CLIENT_API
#endif

#define QRT_CLIENT_SOVERSION 1

typedef struct qrt_client qrt_client;

/* What went wrong.  code is the JSON-RPC error code for errors the agent
 * sent (-32700..-32000), 0 for local failures.  reason is the stable
 * data.reason (agent errors) or one of the local reasons "unreachable",
 * "timeout", "disconnected", "protocol_error", "client_error".  */
typedef struct qrt_error {
	int code;
	int sys_errno;     /* positive errno of a local failure, else 0 */
	char reason[64];
	char message[512]; /* human text, truncated to fit */
} qrt_error;

/* A slot request (slots.query, slots.reserve).  Times are ns since the
 * Unix epoch (UTC); durations are ns.  Zero means "not given".  */
typedef struct qrt_slot_request {
	int64_t duration_ns;   /* required, > 0 */
	int64_t not_before_ns; /* 0: now */
	int64_t deadline_ns;   /* 0: no deadline */
	int32_t priority;
	double min_fidelity;   /* 0: any */
	const char *qpu;       /* NULL: any QPU of the host */
} qrt_slot_request;

/* The fields of a reservation (or job: the ids are the same) a caller
 * needs to act on it.  The full record is in the JSON of qrt_call().  */
typedef struct qrt_reservation {
	uint64_t reservation_id;
	uint64_t fencing_token;
	int64_t start_ns;
	int64_t end_ns;
	int64_t lease_expires_ns;
	uint64_t calibration_id;
	char qpu[64];
	char state[32]; /* held, committed, dispatched, completed, ... */
} qrt_reservation;

/* The library's version, e.g. "0.1.0".  */
QRT_CLIENT_API const char *qrt_client_version(void);

/* The socket path used when NULL is passed: $QRT_SOCKET if set, else the
 * built-in default.  Static storage; valid until the next call.  */
QRT_CLIENT_API const char *qrt_default_socket(void);

/* Connect (bounded by 2000 ms).  path NULL: qrt_default_socket(); a socket
 * path, or tcp://HOST:PORT (authenticated with MUNGE, as above).
 * On success *out holds a client to qrt_close().  */
QRT_CLIENT_API int qrt_connect(const char *path, qrt_client **out, qrt_error *err);
QRT_CLIENT_API int qrt_connect_timeout(const char *path, int connect_timeout_ms,
                                       qrt_client **out, qrt_error *err);

/* Timeout for each call's write and reply, in ms (> 0).  */
QRT_CLIENT_API int qrt_set_timeout(qrt_client *c, int timeout_ms);

/* The client's socket fd, for poll() in an event loop (events).  */
QRT_CLIENT_API int qrt_fd(const qrt_client *c);

/* Call one method.  params_json: a JSON object, or NULL for none.
 * On success *result_json (if result_json is not NULL) receives the
 * result as JSON text, to qrt_free().  */
QRT_CLIENT_API int qrt_call(qrt_client *c, const char *method, const char *params_json,
                            char **result_json, qrt_error *err);

/* Convenience calls.  Each is one qrt_call with the parameters built for
 * you; result_json/out may be NULL when the caller does not need them.  */
QRT_CLIENT_API int qrt_hello(qrt_client *c, char **result_json, qrt_error *err);
QRT_CLIENT_API int qrt_slots_query(qrt_client *c, const qrt_slot_request *req,
                                   char **result_json, qrt_error *err);
/* idempotency_key: required, unique per logical request (e.g. the Slurm
 * job id); retrying with the same key returns the same reservation.
 * lease_ns 0: the agent's default lease.  */
QRT_CLIENT_API int qrt_slots_reserve(qrt_client *c, const qrt_slot_request *req,
                                     const char *idempotency_key, int64_t lease_ns,
                                     qrt_reservation *out, qrt_error *err);
QRT_CLIENT_API int qrt_slots_heartbeat(qrt_client *c, uint64_t reservation_id,
                                       uint64_t fencing_token, qrt_reservation *out,
                                       qrt_error *err);
QRT_CLIENT_API int qrt_slots_release(qrt_client *c, uint64_t reservation_id,
                                     uint64_t fencing_token, qrt_error *err);
/* Commit a payload (any bytes; sent base64-encoded) into a held
 * reservation.  */
QRT_CLIENT_API int qrt_jobs_submit(qrt_client *c, uint64_t reservation_id,
                                   uint64_t fencing_token, const void *payload,
                                   size_t payload_len, qrt_reservation *out, qrt_error *err);
QRT_CLIENT_API int qrt_jobs_status(qrt_client *c, uint64_t job_id, qrt_reservation *out,
                                   qrt_error *err);
QRT_CLIENT_API int qrt_jobs_cancel(qrt_client *c, uint64_t job_id, qrt_error *err);
/* jobs.cancel with the job's fencing token: a token that is not the job's
 * is refused (-EREMOTEIO, reason "bad_fencing_token") and nothing changes,
 * whatever the caller's roles.  For a caller that cancels what it reserved
 * (the SPANK plugin).  Added with symbol version QRT_CLIENT_1.2.  */
QRT_CLIENT_API int qrt_jobs_cancel_fenced(qrt_client *c, uint64_t job_id, uint64_t fencing_token,
                                          qrt_error *err);

/* A gang: k reservations with one start on k distinct QPUs, all or
 * nothing (slots.reserve with gang_size k).  The members share one
 * fencing token; a jobs.submit, release or cancel on any member applies
 * to every member.  req->qpu must be NULL (qrtd picks the QPUs).  Fills
 * out[0..k-1] in the order qrtd returned them and returns k (>= 1), or a
 * negative errno (-ENOSPC when out_cap < k, before anything is sent).
 * k == 1 is a plain qrt_slots_reserve.  */
QRT_CLIENT_API int qrt_slots_reserve_gang(qrt_client *c, const qrt_slot_request *req,
                                          size_t k, const char *idempotency_key,
                                          int64_t lease_ns, qrt_reservation *out,
                                          size_t out_cap, qrt_error *err);
/* A finished job's result bytes (jobs.result, base64 decoded).  On
 * success *result (to qrt_free; NUL-terminated for convenience, the NUL
 * not counted) and *result_len are set and, when out is not NULL,
 * out->state holds "completed" or "failed".  A job without a result yet
 * is -EREMOTEIO with err->reason "not_ready".  */
QRT_CLIENT_API int qrt_jobs_result(qrt_client *c, uint64_t job_id, void **result,
                                   size_t *result_len, qrt_reservation *out, qrt_error *err);

/* Read one member of a JSON text (a result from qrt_call, an event) by
 * JSON pointer (RFC 6901, e.g. "/partition/isolated_cpus", "/gang/0/qpu"),
 * so C callers need no JSON library.  A string is copied without quotes;
 * any other value as compact JSON text.  Returns 0, -ENOENT when the
 * pointer names nothing, -ENOSPC when buf (len bytes, NUL included) is too
 * small (buf then holds a truncated copy), -EINVAL when json is not JSON
 * or the pointer is malformed.  */
QRT_CLIENT_API int qrt_json_get(const char *json, const char *pointer, char *buf, size_t len);

/* Multi-agent placement (power-of-d; qrt-fleet-sim's limited-sharing
 * structure): every agent in agents[0..n) is asked at once to hold a slot
 * for req (slots.reserve, the same idempotency_key on each); the hold that
 * starts first (then ends first, then comes first in agents) is kept and
 * the others are released.  n is 1..16.
 *
 * On success returns 0, *chosen (if not NULL) is the winner's index and
 * *out its reservation (commit it with qrt_jobs_submit on agents[*chosen]).
 * per_agent (if not NULL) receives n values: 0 for an agent that held a
 * slot (the winner, or a loser that was released), else the negative errno
 * its reserve failed with (an agent that is down or refuses is skipped;
 * -ESTALE: on a retry, this agent's hold for the key was already released).
 * When no agent holds a slot, returns the error of the first agent that
 * answered with one (e.g. -EREMOTEIO, reason "no_fit"), else the first
 * local error (e.g. -ECONNREFUSED).  A failed release is not an error: the
 * loser's lease runs out by itself.  Retrying with the same key is safe:
 * each agent returns the hold it already gave that key.
 * Added with symbol version QRT_CLIENT_1.1 (same SOVERSION).  */
QRT_CLIENT_API int qrt_place_best(qrt_client *const *agents, size_t n,
                                  const qrt_slot_request *req, const char *idempotency_key,
                                  int64_t lease_ns, size_t *chosen, qrt_reservation *out,
                                  int *per_agent, qrt_error *err);

/* Events: call qrt_call(c, "events.subscribe", ...) first.  Waits up to
 * timeout_ms (-1: forever) for the next event; returns 0 with
 * *event_json set (params of the events.event notification: seq, type,
 * data), or -ETIMEDOUT with *event_json NULL when none came.  */
QRT_CLIENT_API int qrt_next_event(qrt_client *c, int timeout_ms, char **event_json,
                                  qrt_error *err);

/* A reservation.yield_requested event, read (qrtd(8), CALIBRATION BLOCKS):
 * qrtd asks the holder of the held reservation reservation_id to give its
 * time to calibration block block_id by deadline_ns.  Release it, or move:
 * reserve again at or after free_start_ns (0: no free start known) and
 * release it.  at_deadline says what happens if it does neither: "revoke"
 * (the reservation is displaced and its fencing token dead) or "keep" (it
 * stays; the block fails).  Strings are truncated to fit.  */
typedef struct qrt_yield_request {
	uint64_t reservation_id;
	uint64_t block_id;
	int64_t start_ns;       /* the reservation's start */
	int64_t deadline_ns;
	int64_t free_start_ns;
	int64_t block_start_ns;
	int64_t block_end_ns;
	char qpu[64];
	char step[72];          /* the block's calibration step */
	char at_deadline[16];   /* "revoke" or "keep" */
	char reason[256];
} qrt_yield_request;

/* Read the event event_json (from qrt_next_event) into *out when it is a
 * reservation.yield_requested: returns 0, -ENOENT for an event of another
 * type (*out zeroed), -EINVAL when event_json is not an event's JSON or
 * the event lacks reservation_id or deadline_ns.  Added with symbol
 * version QRT_CLIENT_1.3.  */
QRT_CLIENT_API int qrt_yield_request_read(const char *event_json, qrt_yield_request *out);

/* Free a string this library returned.  NULL is fine.  */
QRT_CLIENT_API void qrt_free(void *p);
/* Close the connection and free the client.  NULL is fine.  */
QRT_CLIENT_API void qrt_close(qrt_client *c);

/* The qrtctl exit status for a data.reason (1 when unknown), so C callers
 * and scripts agree on one table.  */
QRT_CLIENT_API int qrt_exit_code_for_reason(const char *reason);

#ifdef __cplusplus
}
#endif

#endif /* QRT_CLIENT_H */
