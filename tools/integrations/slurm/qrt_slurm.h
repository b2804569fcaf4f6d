/*
 * qrt_slurm.h: the Slurm-independent half of spank_qrt.so and
 * qrt-slurm-prolog, so it can be unit-tested without Slurm: option parsing
 * (--qpu-* options, or a job comment's "qpu:" request), the reservation
 * request derived from them and the job's time limit, the idempotency key,
 * the QRT_* environment, CPU lists, the state files root keeps (a step's,
 * for the job epilog; a job's, for the prolog's TaskProlog and Epilog), and
 * the messages a user sees.  Both programs take every Slurm semantic from
 * here: durations, +/@ times, keys, limits, state files.
 *
 * Conventions (as libqrt-client): int functions return 0 or a NEGATIVE
 * errno; every message buffer is filled on failure; nothing here reads a
 * clock (callers pass now_ns) or the environment.
 */
#ifndef QRT_SLURM_H
#define QRT_SLURM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QRT_SLURM_MAX_GANG 64
#define QRT_SLURM_MSG 1024

/* Slurm's special step ids (slurm.h SLURM_BATCH_SCRIPT etc.), repeated
 * here so this file needs no Slurm header. */
#define QRT_SLURM_STEP_PENDING 0xfffffffdu
#define QRT_SLURM_STEP_EXTERN 0xfffffffcu
#define QRT_SLURM_STEP_BATCH 0xfffffffbu
#define QRT_SLURM_STEP_INTERACTIVE 0xfffffffau

/* Plugin arguments from plugstack.conf (key=value words). */
typedef struct qrt_slurm_config {
	char socket[256];      /* socket=PATH; default /run/qrtd/qrtd.sock */
	char state_dir[256];   /* state_dir=PATH; default /run/qrtd-slurm */
	char cluster[64];      /* cluster=NAME; default: slurm.conf's ClusterName */
	int64_t setup_margin_ns; /* setup_margin=DUR; default 2 s */
	int64_t max_lease_ns;  /* max_lease=DUR; default 1 h (qrtd's maximum) */
	int64_t submit_lead_ns; /* submit_lead=DUR; default 300 ms: QRT_SUBMIT_BY_NS is
				 * the slot's start less this (qrtd hands jobs to its
				 * dispatcher up to max(lead_max + 20 ms, 250 ms) ahead,
				 * in start order) */
	int timeout_ms;        /* timeout=DUR; default 5 s, per call */
	int cpuset_check;      /* cpuset_check=yes|no; default yes */
	char node_url[256];    /* qrtd_node=tcp://%n:PORT; default "" (off): every node of
				* a step has its own qrtd there, and srun gives the
				* step one common start on all of them */
	char node_list[256];   /* qrtd_nodes=HOSTLIST; default "" (every node): the
				* nodes qrtd_node= applies to */
	int64_t heartbeat_lease_ns; /* lease=DUR; default 0 (off): what srun reserves
				     * gets this lease, renewed by srun every third
				     * of it until the step ends, instead of a lease
				     * to the job's time limit */
} qrt_slurm_config;

/* The job's --qpu-* options, parsed.  *_set say whether the user gave
 * them; times are kept as given (relative or absolute) until the step
 * starts and now is known. */
typedef struct qrt_slurm_options {
	int64_t duration_ns; /* --qpu-duration; 0: the plugin does nothing */
	int deadline_set;
	int deadline_relative; /* "+DUR": from the step's start */
	int64_t deadline_ns;
	int not_before_set;
	int not_before_relative;
	int64_t not_before_ns;
	double min_fidelity; /* 0: any */
	int priority_set;
	int32_t priority;
	int count;           /* --qpu-count; 1 when not given */
	int from_comment;    /* given as a job comment's qpu: request (messages
			      * name its keys, and "this job", not --qpu-*) */
} qrt_slurm_options;

/* What the plugin sends to slots.reserve. */
typedef struct qrt_slurm_request {
	int64_t duration_ns;
	int64_t not_before_ns;
	int64_t deadline_ns; /* min(user deadline, job end, now + lease) */
	int64_t lease_ns;
	double min_fidelity;
	int32_t priority;
	int count;
	int deadline_from_job; /* the job's time limit, not the user, set it */
	int from_comment;      /* the options came from a job comment */
} qrt_slurm_request;

/* One reservation of a step (a gang has count of them, one token). */
typedef struct qrt_slurm_member {
	uint64_t id;
	char qpu[64];
} qrt_slurm_member;

typedef struct qrt_slurm_held {
	int n;
	qrt_slurm_member member[QRT_SLURM_MAX_GANG];
	uint64_t fencing_token;
	int64_t start_ns;
	int64_t end_ns;
	int64_t lease_expires_ns;
	char key[160];
} qrt_slurm_held;

void qrt_slurm_config_default(qrt_slurm_config *cfg);
/* One plugstack.conf argument ("socket=/run/qrtd/qrtd.sock"). */
int qrt_slurm_config_arg(qrt_slurm_config *cfg, const char *arg, char *msg, size_t msg_len);
/* Whether a step's cpuset is checked against the isolated CPUs qrtd
 * reports: with cpuset_check=yes and a local socket only.  A tcp:// qrtd is
 * another node's, whose dispatch CPUs say nothing about this node's. */
int qrt_slurm_checks_cpuset(const qrt_slurm_config *cfg);

/* qrtd_node='s URL for one node: every %n replaced by node. */
int qrt_slurm_node_url(const qrt_slurm_config *cfg, const char *node, char *buf, size_t len);

/* The per-node reservations of a common-start step, as srun passes them to
 * every node (QRT_NODE_RESERVATIONS): "node|ids|token|qpus" entries joined
 * by ';', in the step's node order (ids and qpus comma-separated). */
int qrt_slurm_node_entry_format(const char *node, const qrt_slurm_held *h, char *buf,
                                size_t len);
/* Entry number index (the step's relative node id) of text: its node name
 * and reservation (key, times and lease are left to the caller). */
int qrt_slurm_node_entry_parse(const char *text, int index, char *node, size_t node_len,
                               qrt_slurm_held *out);

void qrt_slurm_options_default(qrt_slurm_options *o);

/* A duration: an integer with a unit, ns us ms s m h ("2ms", "1500us",
 * "3s"); a bare integer is ns.  Strictly positive, at most a year. */
int qrt_slurm_parse_duration(const char *text, int64_t *out_ns, char *msg, size_t msg_len);
/* A point in time: "+DUR" (relative to the step's start) or "@SECONDS"
 * (Unix time, decimals allowed: "@1767225600.5"). */
int qrt_slurm_parse_time(const char *text, int *relative, int64_t *out_ns, char *msg,
                         size_t msg_len);

/* One --qpu-* option by its name without the dashes ("qpu-duration"). */
int qrt_slurm_option(qrt_slurm_options *o, const char *name, const char *value, char *msg,
                     size_t msg_len);

/* The request of a job comment, for sites without SPANK (qrt-slurm-prolog):
 * the first word "qpu:KEY=VALUE,..." of comment, keys duration (required),
 * count, deadline, not-before, min-fidelity and priority, each taking what
 * its --qpu-* option takes.  1 with *o set (from_comment), 0 when the
 * comment has no qpu: word, -EINVAL with msg naming the item. */
int qrt_slurm_comment_options(const char *comment, qrt_slurm_options *o, char *msg,
                              size_t msg_len);

/* The reservation request of a step that starts at now_ns, in a job that
 * ends at job_end_ns (0: unknown or unlimited).  Fails (with why) when the
 * job's time limit leaves no room for the slot, or the options contradict
 * each other (not-before after the deadline). */
int qrt_slurm_build_request(const qrt_slurm_options *o, const qrt_slurm_config *cfg,
                            int64_t now_ns, int64_t job_end_ns, qrt_slurm_request *out,
                            char *msg, size_t msg_len);

/* The canonical text of the options (QRT_REQUEST): equal texts, equal
 * requests.  A step whose environment carries the same QRT_REQUEST and a
 * key of the same job uses the reservation of the step that made it. */
int qrt_slurm_request_text(const qrt_slurm_options *o, char *buf, size_t len);

/* Whether name may be a key's cluster: 1 to 63 letters, digits, '.', '_'
 * or '-' (what Slurm's ClusterName is), so that a key can break no line of
 * a state file nor a field of QRT_NODE_RESERVATIONS. */
int qrt_slurm_cluster_ok(const char *name);
/* "slurm:<cluster>:<job>.<step>"; step is a number, "batch", "extern" or
 * "interactive"; cluster "" is "-".  -EINVAL when cluster is not
 * qrt_slurm_cluster_ok. */
int qrt_slurm_key(const char *cluster, uint32_t job_id, uint32_t step_id, char *buf, size_t len);
/* "slurm:<cluster>:<job>.job": the key of a whole job's reservation
 * (qrt-slurm-prolog); -EINVAL as qrt_slurm_key. */
int qrt_slurm_job_key(const char *cluster, uint32_t job_id, char *buf, size_t len);
/* Whether key names a step of job_id on cluster. */
int qrt_slurm_key_is_job(const char *key, const char *cluster, uint32_t job_id);

/* QRT_RESERVATION_ID / QRT_QPUS: the members, comma-separated in order. */
int qrt_slurm_ids_text(const qrt_slurm_held *h, char *buf, size_t len);
int qrt_slurm_qpus_text(const qrt_slurm_held *h, char *buf, size_t len);

/* CPU lists ("0-3,8,10-11") as bit sets of up to 1024 CPUs. */
#define QRT_SLURM_CPU_WORDS 16
typedef struct qrt_slurm_cpus {
	uint64_t bits[QRT_SLURM_CPU_WORDS];
} qrt_slurm_cpus;
int qrt_slurm_cpus_parse(const char *list, qrt_slurm_cpus *out);
/* The CPUs in both a and b, as a list ("" when none); returns their count. */
int qrt_slurm_cpus_overlap(const qrt_slurm_cpus *a, const qrt_slurm_cpus *b, char *buf, size_t len);
int qrt_slurm_cpus_text(const qrt_slurm_cpus *s, char *buf, size_t len);

/* The state file of one step, for the job epilog: written by root in a
 * root-owned directory, read back only from there.  Formatting refuses
 * (-EINVAL) a key or QPU name with a control character (a newline would
 * add a line of its own) or a QPU name with ','; parsing refuses a field
 * given twice. */
int qrt_slurm_state_format(const qrt_slurm_held *h, char *buf, size_t len);
int qrt_slurm_state_parse(const char *text, qrt_slurm_held *out);
/* "<job>.<step>" (file name of a step's state) */
int qrt_slurm_state_name(uint32_t job_id, uint32_t step_id, char *buf, size_t len);

/* The record qrt-slurm-prolog keeps per job ("<job>.job" in its state
 * directory, root's): what its Prolog reserved and at which qrtd, or why
 * there is no reservation (its TaskProlog hands that to the job as
 * QRT_ERROR).  Formatting refuses (-EINVAL) a key, socket, QPU name or
 * reason that would break a line, and writes error with every control
 * character as a space; parsing refuses an unknown field or one given
 * twice, and a record that is neither. */
typedef struct qrt_slurm_job_record {
	qrt_slurm_held held;      /* held.n 0: no reservation (reason, error) */
	char socket[256];
	char reason[64];
	char error[QRT_SLURM_MSG];
} qrt_slurm_job_record;
int qrt_slurm_job_record_format(const qrt_slurm_job_record *r, char *buf, size_t len);
int qrt_slurm_job_record_parse(const char *text, qrt_slurm_job_record *out);

/* A time of `scontrol show job -o` ("StartTime=2026-12-01T04:30:31"), the
 * calendar fields in *out (local time, as scontrol prints it: the caller
 * gives them to mktime).  0, or -ENOENT when the field is missing or not a
 * time ("Unknown", "None"). */
struct tm;
int qrt_slurm_scontrol_time(const char *text, const char *field, struct tm *out);

/* The message a user reads when the reservation failed: what was asked,
 * qrtd's reason and message, and the next possible start when known
 * (next_start_ns 0: none known).  "this step", or "this job" for a
 * request from a job comment. */
void qrt_slurm_failure_message(const qrt_slurm_request *req, const char *reason,
                               const char *detail, int64_t next_start_ns, int64_t now_ns,
                               char *buf, size_t len);

/* "2026-12-01T04:30:31.250Z" */
void qrt_slurm_format_utc(int64_t t_ns, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* QRT_SLURM_H */
