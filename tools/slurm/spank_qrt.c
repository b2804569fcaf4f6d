/*
 * spank_qrt.so: QPU time slots from qrtd as part of a Slurm job step.
 *
 * A step that carries --qpu-duration (srun, sbatch or salloc) gets a slot
 * reserved through the node's qrtd before its first task starts, the QRT_*
 * variables in its tasks' environment, and the slot released when the step
 * ends by any path.  See spank_qrt(8).
 *
 * Who runs what (slurmstepd, remote context):
 *
 *   init           root   register the options, read plugstack.conf args
 *   init_post_opt  root   decide what the step does; from slurmctld the
 *                         step's start (the anchor of relative times, so a
 *                         restarted slurmstepd repeats the same request)
 *                         and the job's end (its time limit)
 *   user_init      user   connect to qrtd AS THE JOB'S USER (seteuid'd:
 *                         SO_PEERCRED names the user, so the reservation
 *                         belongs to the uid whose tasks submit into it),
 *                         read the isolated CPUs, reserve, export QRT_*
 *   task_post_fork root   write the step's state file for the job epilog
 *   task_init      user   in each task before exec: fail the task when the
 *                         reservation failed or its cpuset overlaps the
 *                         isolated CPUs, with the reason on its stderr
 *   task_exit      root   after the last local task: release (held) or
 *                         cancel (committed) the slot
 *   exit           root   the same, if task_exit could not
 *   job_epilog     root   (slurmd, job_script context) release whatever a
 *                         step left behind (slurmstepd killed, qrtd down)
 *
 * and in srun (local context), only for socket=tcp:// (a QPU node reached
 * from compute nodes) or qrtd_node= (each node its own qrtd):
 *
 *   local_user_init  user  after the allocation, before any task: ONE
 *                         reservation for the step on the remote qrtd, or
 *                         one per node at a common start; QRT_* (or
 *                         QRT_FAILURE) into the environment the tasks get
 *   exit             user  release what srun made, after every node's tasks
 *
 * The nodes then inherit (MODE_INHERIT) or take their own part of a
 * common start (MODE_NODE).  Leases end by the job's time limit (at most
 * max_lease); with lease= srun's are that short instead and a thread in
 * srun renews them, so a dead srun leaves its slots to expiry soon.
 *
 * Why failures surface in task_init and not in user_init: a non-zero
 * user_init is ignored for srun and DRAINS THE NODE for sbatch (spank(7),
 * "Errors"); task_init fails the step at once (exit 1) without draining,
 * and whatever it writes to fd 2 is the job's stderr.
 *
 * Return values: Slurm callbacks return 0 or -1 (SLURM_ERROR); spank_*()
 * calls return spank_err_t, ESPANK_SUCCESS (0) or a POSITIVE ESPANK_*
 * code; libqrt-client returns 0 or a NEGATIVE errno.  Each is checked as
 * what it is.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include <qrt/client.h>

#include "qrt_slurm.h"

SPANK_PLUGIN(qrt, 1)

enum step_mode {
	MODE_OFF,     /* no --qpu-duration, or the extern step */
	MODE_OWN,     /* this step reserves (and releases) its slot */
	MODE_INHERIT, /* an outer step of the job, or srun, holds the slot (QRT_* inherited) */
	MODE_NODE,    /* srun reserved this node's part of a common start: exported
		       * here, released here at the last task's exit */
};

/* How many nodes a common-start step may span. */
#define MAX_NODES 64

/* One slurmstepd serves one step: module state is the step's state. */
static qrt_slurm_config cfg;
static char cfg_error[QRT_SLURM_MSG];
/* Set by the option callbacks, which in slurmstepd run BEFORE
 * slurm_spank_init: the defaults are static. */
static qrt_slurm_options opts = {.count = 1};
static char opt_error[QRT_SLURM_MSG];
static enum step_mode mode = MODE_OFF;
static uint32_t job_id;
static uint32_t step_id;
static char cluster[64];
static char key[160];
static char request_text[256];
static qrt_slurm_request req;
static qrt_slurm_held held;
static int have_held;
static char failure[QRT_SLURM_MSG];
static qrt_slurm_cpus isolated;
static int isolated_known;
static int state_written;
static int released;
static uint32_t tasks_exited;
/* The qrtd this step talks to: cfg.socket, or for a common-start step the
 * node's own (qrtd_node= with %n replaced). */
static char step_socket[256];

/* srun (local context): what it reserved for the step, released at its exit. */
static struct node_hold {
	char name[64];
	char url[256];
	qrt_slurm_held h;
	int have;
} nodes[MAX_NODES];
static int n_nodes;
static int local_reserved;
/* srun's heartbeat thread (lease=): renews nodes[] until stop is set. */
static pthread_t heartbeat_thread;
static int heartbeat_running;
static pthread_mutex_t heartbeat_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t heartbeat_cv = PTHREAD_COND_INITIALIZER;
static int heartbeat_stop;

/* What slurmstepd logs at info goes to slurmd's log; in srun, info is the
 * user's terminal: there the plugin's notes wait for srun -v. */
#define note(...)                                                                                  \
	do {                                                                                       \
		if (spank_context() == S_CTX_LOCAL) {                                              \
			slurm_verbose(__VA_ARGS__);                                                \
		} else {                                                                           \
			slurm_info(__VA_ARGS__);                                                   \
		}                                                                                  \
	} while (0)

static int64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------ options */

enum { OPT_DURATION, OPT_DEADLINE, OPT_MIN_FIDELITY, OPT_PRIORITY, OPT_COUNT, OPT_NOT_BEFORE };

static const char *const option_names[] = {
	[OPT_DURATION] = "qpu-duration",   [OPT_DEADLINE] = "qpu-deadline",
	[OPT_MIN_FIDELITY] = "qpu-min-fidelity", [OPT_PRIORITY] = "qpu-priority",
	[OPT_COUNT] = "qpu-count",         [OPT_NOT_BEFORE] = "qpu-not-before",
};

static int option_cb(int val, const char *optarg, int remote)
{
	char msg[QRT_SLURM_MSG / 2];
	if (val < 0 || val > OPT_NOT_BEFORE) {
		return -1;
	}
	if (qrt_slurm_option(&opts, option_names[val], optarg, msg, sizeof(msg)) < 0) {
		if (!remote) {
			/* srun/sbatch/salloc print this and refuse the job. */
			slurm_error("qrt: %s", msg);
			return -1;
		}
		/* Validated on the submit side already; keep it for task_init. */
		snprintf(opt_error, sizeof(opt_error), "qrt: %s", msg);
	}
	return 0;
}

static struct spank_option options[] = {
	{"qpu-duration", "DURATION",
	 "reserve a QPU slot of DURATION (2ms, 500us, 1s) for this job step through qrtd",
	 1, OPT_DURATION, option_cb},
	{"qpu-deadline", "+DUR|@SECS",
	 "the slot must end by then (+DUR from the step's start, or @UNIX_SECONDS); "
	 "default: the job's time limit", 1, OPT_DEADLINE, option_cb},
	{"qpu-min-fidelity", "F", "only where the predicted fidelity is at least F (0..1]", 1,
	 OPT_MIN_FIDELITY, option_cb},
	{"qpu-priority", "N", "priority of the reservation (higher first)", 1, OPT_PRIORITY,
	 option_cb},
	{"qpu-count", "K", "a gang of K QPUs with the same start (default 1)", 1, OPT_COUNT,
	 option_cb},
	{"qpu-not-before", "+DUR|@SECS",
	 "the slot starts no earlier (default: the step's start plus the site's setup margin)",
	 1, OPT_NOT_BEFORE, option_cb},
};

/* ------------------------------------------------------------ helpers */

static int get_u32(spank_t sp, spank_item_t item, uint32_t *out)
{
	return spank_get_item(sp, item, out) == ESPANK_SUCCESS ? 0 : -1;
}

static void parse_args(int ac, char **av)
{
	qrt_slurm_config_default(&cfg);
	cfg_error[0] = '\0';
	for (int i = 0; i < ac; ++i) {
		char msg[QRT_SLURM_MSG / 2];
		if (qrt_slurm_config_arg(&cfg, av[i], msg, sizeof(msg)) < 0 && cfg_error[0] == '\0') {
			snprintf(cfg_error, sizeof(cfg_error),
				 "qrt: the site's spank_qrt configuration is wrong (%s); ask the "
				 "administrators",
				 msg);
			slurm_error("qrt: %s", msg);
		}
	}
}

static void fail_with(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void fail_with(const char *fmt, ...)
{
	if (failure[0] != '\0') {
		return; /* keep the first reason */
	}
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
	note("qrt: %s: %s", key[0] != '\0' ? key : "step", failure);
}

static int set_env(spank_t sp, const char *name, const char *value)
{
	/* In srun (local context) the tasks' environment is srun's own. */
	if (spank_context() == S_CTX_LOCAL) {
		if (setenv(name, value, 1) < 0) {
			fail_with("qrt: cannot export %s to the tasks: %s", name, strerror(errno));
			return -1;
		}
		return 0;
	}
	const spank_err_t rc = spank_setenv(sp, name, value, 1);
	if (rc != ESPANK_SUCCESS) {
		fail_with("qrt: cannot export %s to the tasks: %s", name, spank_strerror(rc));
		return -1;
	}
	return 0;
}

static int export_held(spank_t sp)
{
	char ids[QRT_SLURM_MAX_GANG * 21];
	char qpus[QRT_SLURM_MAX_GANG * 65];
	char num[32];
	if (qrt_slurm_ids_text(&held, ids, sizeof(ids)) < 0 ||
	    qrt_slurm_qpus_text(&held, qpus, sizeof(qpus)) < 0) {
		fail_with("qrt: reservation list too long to export");
		return -1;
	}
	int rc = set_env(sp, "QRT_SOCKET", step_socket);
	rc |= set_env(sp, "QRT_RESERVATION_ID", ids);
	rc |= set_env(sp, "QRT_QPUS", qpus);
	snprintf(num, sizeof(num), "%" PRId64, held.start_ns);
	rc |= set_env(sp, "QRT_SLOT_START_NS", num);
	snprintf(num, sizeof(num), "%" PRId64, held.end_ns);
	rc |= set_env(sp, "QRT_SLOT_END_NS", num);
	snprintf(num, sizeof(num), "%" PRId64, held.start_ns - cfg.submit_lead_ns);
	rc |= set_env(sp, "QRT_SUBMIT_BY_NS", num);
	snprintf(num, sizeof(num), "%" PRIu64, held.fencing_token);
	rc |= set_env(sp, "QRT_FENCING_TOKEN", num);
	snprintf(num, sizeof(num), "%" PRId64, held.lease_expires_ns);
	rc |= set_env(sp, "QRT_LEASE_EXPIRES_NS", num);
	rc |= set_env(sp, "QRT_IDEMPOTENCY_KEY", key);
	rc |= set_env(sp, "QRT_REQUEST", request_text);
	return rc;
}

static qrt_client *connect_to(const char *url, qrt_error *err)
{
	qrt_client *c = NULL;
	const int timeout = cfg.timeout_ms < 2000 ? cfg.timeout_ms : 2000;
	if (qrt_connect_timeout(url, timeout, &c, err) < 0) {
		return NULL;
	}
	qrt_set_timeout(c, cfg.timeout_ms);
	return c;
}

static qrt_client *connect_qrtd(qrt_error *err)
{
	return connect_to(step_socket[0] != '\0' ? step_socket : cfg.socket, err);
}

/* The next start qrtd could give this request, ignoring the deadline (for
 * the message of a reservation that did not fit), or 0. */
static int64_t earliest_start(qrt_client *c, int64_t not_before_ns, char *why, size_t why_len);

static int64_t next_possible_start(qrt_client *c)
{
	return earliest_start(c, req.not_before_ns, NULL, 0);
}

/* The earliest start qrtd could give this request at or after
 * not_before_ns, ignoring the deadline, or 0 (why says why). */
static int64_t earliest_start(qrt_client *c, int64_t not_before_ns, char *why, size_t why_len)
{
	char params[512];
	char *out = NULL;
	char buf[32];
	int n = snprintf(params, sizeof(params),
			 "{\"duration_ns\":%" PRId64 ",\"not_before_ns\":%" PRId64
			 ",\"priority\":%" PRId32 ",\"max_candidates\":1",
			 req.duration_ns, not_before_ns, req.priority);
	if (req.min_fidelity > 0) {
		n += snprintf(params + n, sizeof(params) - (size_t)n, ",\"min_fidelity\":%.17g",
			      req.min_fidelity);
	}
	if (req.count > 1) {
		n += snprintf(params + n, sizeof(params) - (size_t)n, ",\"gang_size\":%d", req.count);
	}
	snprintf(params + n, sizeof(params) - (size_t)n, "}");
	qrt_error err;
	if (qrt_call(c, "slots.query", params, &out, &err) < 0) {
		if (why != NULL) {
			snprintf(why, why_len, "slots.query: %.400s (reason %.60s)", err.message, err.reason);
		}
		return 0;
	}
	int64_t start = 0;
	if (qrt_json_get(out, "/candidates/0/start_ns", buf, sizeof(buf)) == 0) {
		start = strtoll(buf, NULL, 10);
	} else if (why != NULL) {
		char none[256] = "no candidate";
		qrt_json_get(out, "/why_none", none, sizeof(none));
		snprintf(why, why_len, "%s", none);
	}
	qrt_free(out);
	return start;
}

static void read_isolated(qrt_client *c)
{
	char *out = NULL;
	char list[512];
	qrt_error err;
	if (qrt_call(c, "agent.status", NULL, &out, &err) < 0) {
		slurm_info("qrt: %s: agent.status: %s (%s); no cpuset check", key, err.message,
			   err.reason);
		return;
	}
	if (qrt_json_get(out, "/partition/isolated_cpus", list, sizeof(list)) == 0 &&
	    qrt_slurm_cpus_parse(list, &isolated) == 0) {
		isolated_known = 1;
	}
	qrt_free(out);
}

/* slots.reserve of the step's request between not_before_ns and
 * deadline_ns under idempotency key k: 0 and *h, or -1 and *err. */
static int reserve_into(qrt_client *c, int64_t not_before_ns, int64_t deadline_ns,
			const char *k, qrt_slurm_held *h, qrt_error *err)
{
	qrt_slot_request r;
	qrt_reservation got[QRT_SLURM_MAX_GANG];
	memset(&r, 0, sizeof(r));
	r.duration_ns = req.duration_ns;
	r.not_before_ns = not_before_ns;
	r.deadline_ns = deadline_ns;
	r.priority = req.priority;
	r.min_fidelity = req.min_fidelity;
	const int n = qrt_slots_reserve_gang(c, &r, (size_t)req.count, k, req.lease_ns, got,
					     QRT_SLURM_MAX_GANG, err);
	if (n < 0) {
		return -1;
	}
	memset(h, 0, sizeof(*h));
	h->n = n;
	for (int i = 0; i < n; ++i) {
		h->member[i].id = got[i].reservation_id;
		snprintf(h->member[i].qpu, sizeof(h->member[i].qpu), "%s", got[i].qpu);
	}
	h->fencing_token = got[0].fencing_token;
	h->start_ns = got[0].start_ns;
	h->end_ns = got[0].end_ns;
	h->lease_expires_ns = got[0].lease_expires_ns;
	snprintf(h->key, sizeof(h->key), "%s", key);
	char ids[256];
	qrt_slurm_ids_text(h, ids, sizeof(ids));
	note("qrt: %s: reserved %s (%d QPU%s) start_ns %" PRId64 " end_ns %" PRId64
		   " lease until %" PRId64,
		   k, ids, n, n == 1 ? "" : "s", h->start_ns, h->end_ns, h->lease_expires_ns);
	return 0;
}

static void reserve(qrt_client *c)
{
	qrt_error err;
	if (reserve_into(c, req.not_before_ns, req.deadline_ns, key, &held, &err) < 0) {
		char msg[QRT_SLURM_MSG];
		const int64_t next = strcmp(err.reason, "no_fit") == 0 ||
					     strcmp(err.reason, "deadline_passed") == 0
				     ? next_possible_start(c)
				     : 0;
		qrt_slurm_failure_message(&req, err.reason, err.message, next, realtime_ns(), msg,
					  sizeof(msg));
		fail_with("%s", msg);
		return;
	}
	have_held = 1;
}

/* Give a step's slot back: release a held one, cancel a committed one;
 * one that was dispatched or has ended needs nothing.  0 when qrtd has it
 * in a final state, -1 when qrtd could not be told (try again later). */
static int give_back_at(const char *url, const qrt_slurm_held *h, const char *who)
{
	qrt_error err;
	qrt_client *c = connect_to(url, &err);
	if (c == NULL) {
		slurm_error("qrt: %s: %s: cannot reach qrtd at %s to release %s: %s", who, h->key,
			    url, h->key, err.message);
		return -1;
	}
	int rc = 0;
	const uint64_t id = h->member[0].id; /* a gang acts as one */
	if (qrt_slots_release(c, id, h->fencing_token, &err) == 0) {
		note("qrt: %s: %s: released reservation %" PRIu64, who, h->key, id);
	} else if (strcmp(err.reason, "illegal_transition") == 0) {
		if (qrt_jobs_cancel(c, id, &err) == 0) {
			note("qrt: %s: %s: cancelled committed job %" PRIu64, who, h->key, id);
		} else if (strcmp(err.reason, "illegal_transition") != 0) {
			slurm_error("qrt: %s: %s: jobs.cancel %" PRIu64 ": %s (%s)", who, h->key, id,
				    err.message, err.reason);
			rc = -1;
		}
	} else if (strcmp(err.reason, "not_found") != 0 && strcmp(err.reason, "lease_expired") != 0) {
		slurm_error("qrt: %s: %s: slots.release %" PRIu64 ": %s (%s)", who, h->key, id,
			    err.message, err.reason);
		rc = -1;
	}
	qrt_close(c);
	return rc;
}

static int give_back(const qrt_slurm_held *h, const char *who)
{
	return give_back_at(step_socket[0] != '\0' ? step_socket : cfg.socket, h, who);
}

/* The state directory: root's, and writable by nobody else, because the
 * job epilog (root) acts on what it finds there. */
static int state_dir_ok(void)
{
	struct stat st;
	if (mkdir(cfg.state_dir, 0700) < 0 && errno != EEXIST) {
		slurm_error("qrt: mkdir %s: %s", cfg.state_dir, strerror(errno));
		return 0;
	}
	if (lstat(cfg.state_dir, &st) < 0) {
		slurm_error("qrt: stat %s: %s", cfg.state_dir, strerror(errno));
		return 0;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
		slurm_error("qrt: %s must be a directory owned by root and writable only by root; "
			    "not used",
			    cfg.state_dir);
		return 0;
	}
	return 1;
}

static void write_state(void)
{
	char name[64];
	char path[512];
	char tmp[520];
	char text[QRT_SLURM_MAX_GANG * 90 + 512];
	if (!state_dir_ok() || qrt_slurm_state_name(job_id, step_id, name, sizeof(name)) < 0 ||
	    qrt_slurm_state_format(&held, text, sizeof(text)) < 0) {
		return;
	}
	snprintf(path, sizeof(path), "%s/%s", cfg.state_dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		slurm_error("qrt: open %s: %s", tmp, strerror(errno));
		return;
	}
	const size_t len = strlen(text);
	const ssize_t w = write(fd, text, len);
	const int err = errno;
	close(fd);
	if (w != (ssize_t)len || rename(tmp, path) < 0) {
		slurm_error("qrt: write %s: %s", path, strerror(w < 0 ? err : errno));
		unlink(tmp);
		return;
	}
	state_written = 1;
}

static void remove_state(uint32_t job, uint32_t step)
{
	char name[64];
	char path[512];
	if (qrt_slurm_state_name(job, step, name, sizeof(name)) == 0) {
		snprintf(path, sizeof(path), "%s/%s", cfg.state_dir, name);
		unlink(path);
	}
}

/* The CPUs this task may ever run on: its cpuset, whatever its current
 * affinity.  Asking for every CPU makes the kernel answer with the cpuset
 * (sched_setaffinity intersects with it); the affinity is put back. */
static int task_cpuset(qrt_slurm_cpus *out)
{
	const size_t ncpu = QRT_SLURM_CPU_WORDS * 64;
	const size_t size = CPU_ALLOC_SIZE(ncpu);
	cpu_set_t *orig = CPU_ALLOC(ncpu);
	cpu_set_t *all = CPU_ALLOC(ncpu);
	int rc = -1;
	if (orig == NULL || all == NULL) {
		goto out;
	}
	if (sched_getaffinity(0, size, orig) < 0) {
		goto out;
	}
	CPU_ZERO_S(size, all);
	for (size_t i = 0; i < ncpu; ++i) {
		CPU_SET_S(i, size, all);
	}
	cpu_set_t *ceiling = orig;
	if (sched_setaffinity(0, size, all) == 0) {
		if (sched_getaffinity(0, size, all) == 0) {
			ceiling = all;
		}
		sched_setaffinity(0, size, orig);
	}
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < ncpu; ++i) {
		if (CPU_ISSET_S(i, size, ceiling)) {
			out->bits[i / 64] |= UINT64_C(1) << (i % 64);
		}
	}
	rc = 0;
out:
	if (orig != NULL) {
		CPU_FREE(orig);
	}
	if (all != NULL) {
		CPU_FREE(all);
	}
	return rc;
}

/* ------------------------------------------------------------ callbacks */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); ++i) {
		const spank_err_t rc = spank_option_register(sp, &options[i]);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("qrt: cannot register --%s: %s", options[i].name,
				    spank_strerror(rc));
			return -1;
		}
	}
	parse_args(ac, av); /* srun, too: it reserves for tcp:// and qrtd_node= sites */
	return 0;
}

/* The step's key, its request text and, from its options and slurmctld's
 * record of its start and the job's end, the request itself (failure set
 * when it cannot be made). */
static void prepare_request(spank_t sp)
{
	if (cfg.cluster[0] != '\0') {
		snprintf(cluster, sizeof(cluster), "%s", cfg.cluster);
	} else if (spank_getenv(sp, "SLURM_CLUSTER_NAME", cluster, sizeof(cluster)) !=
		   ESPANK_SUCCESS) {
		const char *env = getenv("SLURM_CLUSTER_NAME");
		slurm_conf_t *conf = NULL;
		if (env != NULL && env[0] != '\0') {
			snprintf(cluster, sizeof(cluster), "%s", env);
		} else if (spank_context() == S_CTX_LOCAL &&
			   slurm_load_ctl_conf((time_t)0, &conf) == SLURM_SUCCESS && conf != NULL &&
			   conf->cluster_name != NULL) {
			snprintf(cluster, sizeof(cluster), "%s", conf->cluster_name);
		} else {
			snprintf(cluster, sizeof(cluster), "-");
		}
		if (conf != NULL) {
			slurm_free_ctl_conf(conf);
		}
	}
	qrt_slurm_key(cluster, job_id, step_id, key, sizeof(key));
	qrt_slurm_request_text(&opts, request_text, sizeof(request_text));
}

static void build_request(void)
{
	/* Relative times and the setup margin count from the step's start as
	 * slurmctld records it, not from this moment: a restarted slurmstepd
	 * then asks for the same request under the same key, and qrtd gives
	 * the same reservation back (a different request would be refused as
	 * a duplicate).  Whole seconds; this moment when slurmctld has no
	 * record. */
	int64_t now = realtime_ns();
	job_step_info_response_msg_t *steps = NULL;
	if (slurm_get_job_steps(0, job_id, step_id, &steps, SHOW_ALL) == SLURM_SUCCESS &&
	    steps != NULL && steps->job_step_count >= 1 && steps->job_steps[0].start_time > 0) {
		now = (int64_t)steps->job_steps[0].start_time * 1000000000;
	} else {
		slurm_info("qrt: %s: no step start time from slurmctld; times count from now", key);
	}
	if (steps != NULL) {
		slurm_free_job_step_info_response_msg(steps);
	}
	time_t end = 0;
	int64_t job_end_ns = 0;
	if (slurm_get_end_time(job_id, &end) == SLURM_SUCCESS && end > 0) {
		job_end_ns = (int64_t)end * 1000000000;
	} else {
		slurm_info("qrt: %s: slurm_get_end_time: %s; the lease is max_lease", key,
			   slurm_strerror(slurm_get_errno()));
	}
	char msg[QRT_SLURM_MSG];
	if (qrt_slurm_build_request(&opts, &cfg, now, job_end_ns, &req, msg, sizeof(msg)) < 0) {
		fail_with("qrt: no QPU slot for this step: %s", msg);
	}
}

/* Whether an outer step of this job (the batch script) already holds the
 * slot this step asks for: its tasks use that one. */
static int outer_step_holds(spank_t sp)
{
	char env_key[160];
	char env_req[256];
	return spank_getenv(sp, "QRT_IDEMPOTENCY_KEY", env_key, sizeof(env_key)) ==
		       ESPANK_SUCCESS &&
	       spank_getenv(sp, "QRT_REQUEST", env_req, sizeof(env_req)) == ESPANK_SUCCESS &&
	       qrt_slurm_key_is_job(env_key, cluster, job_id) && strcmp(env_key, key) != 0 &&
	       strcmp(env_req, request_text) == 0;
}

/* slurmstepd of a step whose srun reserved (QRT_RESERVED_BY=srun and this
 * step's key in the environment): 1 when it did, with mode set. */
static int srun_reserved(spank_t sp)
{
	char by[16];
	char env_key[160];
	char text[QRT_SLURM_MSG];
	if (spank_getenv(sp, "QRT_RESERVED_BY", by, sizeof(by)) != ESPANK_SUCCESS ||
	    strcmp(by, "srun") != 0 ||
	    spank_getenv(sp, "QRT_IDEMPOTENCY_KEY", env_key, sizeof(env_key)) != ESPANK_SUCCESS ||
	    strcmp(env_key, key) != 0) {
		return 0;
	}
	mode = MODE_INHERIT;
	if (spank_getenv(sp, "QRT_FAILURE", text, sizeof(text)) == ESPANK_SUCCESS &&
	    text[0] != '\0') {
		fail_with("%s", text);
		return 1;
	}
	if (spank_getenv(sp, "QRT_NODE_RESERVATIONS", text, sizeof(text)) != ESPANK_SUCCESS) {
		return 1; /* one shared reservation: srun holds and releases it */
	}
	/* A common start: this node's entry, by its relative id in the step. */
	uint32_t node_id = 0;
	char node[64];
	char num[32];
	if (get_u32(sp, S_JOB_NODEID, &node_id) < 0 ||
	    qrt_slurm_node_entry_parse(text, (int)node_id, node, sizeof(node), &held) < 0) {
		fail_with("qrt: srun's QRT_NODE_RESERVATIONS has no entry for node %" PRIu32
			  " of this step", node_id);
		return 1;
	}
	snprintf(held.key, sizeof(held.key), "%s", key);
	if (spank_getenv(sp, "QRT_SLOT_START_NS", num, sizeof(num)) == ESPANK_SUCCESS) {
		held.start_ns = strtoll(num, NULL, 10);
	}
	if (spank_getenv(sp, "QRT_SLOT_END_NS", num, sizeof(num)) == ESPANK_SUCCESS) {
		held.end_ns = strtoll(num, NULL, 10);
	}
	if (spank_getenv(sp, "QRT_LEASE_EXPIRES_NS", num, sizeof(num)) == ESPANK_SUCCESS) {
		held.lease_expires_ns = strtoll(num, NULL, 10);
	}
	if (qrt_slurm_node_url(&cfg, node, step_socket, sizeof(step_socket)) < 0) {
		fail_with("qrt: qrtd_node= for %s is too long", node);
		return 1;
	}
	have_held = 1;
	mode = MODE_NODE;
	slurm_info("qrt: %s: node %s uses reservation %" PRIu64 " at %s (common start %" PRId64
		   ")", key, node, held.member[0].id, step_socket, held.start_ns);
	return 1;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp) != 1 || opts.duration_ns <= 0) {
		return 0;
	}
	snprintf(step_socket, sizeof(step_socket), "%s", cfg.socket);
	if (get_u32(sp, S_JOB_ID, &job_id) < 0 || get_u32(sp, S_JOB_STEPID, &step_id) < 0) {
		slurm_error("qrt: cannot read the job and step ids");
		mode = MODE_OWN;
		fail_with("qrt: the plugin could not read this step's job and step ids");
		return 0;
	}
	if (step_id == QRT_SLURM_STEP_EXTERN) {
		return 0; /* the extern step runs no user task */
	}
	prepare_request(sp);
	if (outer_step_holds(sp)) {
		mode = MODE_INHERIT;
		slurm_info("qrt: %s: uses the slot of an outer step", key);
		return 0;
	}
	if (srun_reserved(sp)) {
		return 0;
	}
	mode = MODE_OWN;
	if (opt_error[0] != '\0') {
		fail_with("%s", opt_error);
		return 0;
	}
	build_request();
	return 0;
}

/* ------------------------------------------------------------ srun */

/* The step's nodes, in its order (the relative node ids), from slurmctld
 * or srun's environment: their count, or -1. */
static int step_nodes(char names[][64], int cap)
{
	char list[4096] = "";
	job_step_info_response_msg_t *steps = NULL;
	if (slurm_get_job_steps(0, job_id, step_id, &steps, SHOW_ALL) == SLURM_SUCCESS &&
	    steps != NULL && steps->job_step_count >= 1 && steps->job_steps[0].nodes != NULL) {
		snprintf(list, sizeof(list), "%s", steps->job_steps[0].nodes);
	}
	if (steps != NULL) {
		slurm_free_job_step_info_response_msg(steps);
	}
	if (list[0] == '\0') {
		const char *env = getenv("SLURM_STEP_NODELIST");
		if (env == NULL) {
			env = getenv("SLURM_JOB_NODELIST");
		}
		if (env == NULL) {
			return -1;
		}
		snprintf(list, sizeof(list), "%s", env);
	}
	hostlist_t hl = slurm_hostlist_create(list);
	if (hl == NULL) {
		return -1;
	}
	int n = 0;
	char *h;
	while ((h = slurm_hostlist_shift(hl)) != NULL) {
		if (n < cap) {
			snprintf(names[n], 64, "%s", h);
		}
		++n;
		free(h);
	}
	slurm_hostlist_destroy(hl);
	return n <= cap ? n : -1;
}

/* Whether every node of the step has its own qrtd (qrtd_node=, and the
 * node in qrtd_nodes= when given). */
static int nodes_have_qrtd(char names[][64], int n)
{
	if (cfg.node_url[0] == '\0' || n <= 0) {
		return 0;
	}
	if (cfg.node_list[0] == '\0') {
		return 1;
	}
	hostlist_t hl = slurm_hostlist_create(cfg.node_list);
	if (hl == NULL) {
		slurm_error("qrt: qrtd_nodes='%s' is not a host list", cfg.node_list);
		return 0;
	}
	int all = 1;
	for (int i = 0; i < n && all; ++i) {
		all = slurm_hostlist_find(hl, names[i]) >= 0;
	}
	slurm_hostlist_destroy(hl);
	return all;
}

static void release_local(const char *who)
{
	for (int i = 0; i < n_nodes; ++i) {
		if (nodes[i].have && give_back_at(nodes[i].url, &nodes[i].h, who) == 0) {
			nodes[i].have = 0;
		}
	}
}

static void format_ns(int64_t t, char *buf, size_t len)
{
	char utc[48];
	qrt_slurm_format_utc(t, utc, sizeof(utc));
	snprintf(buf, len, "%s (%" PRId64 ")", utc, t);
}

/* The common start (spank_qrt(8), COMMON START; qrtd(8)): every node's
 * earliest start at or after not_before, S the latest of them; a hold on
 * each at exactly S; when one refuses (another booking took S meanwhile),
 * every hold released and the round repeated from S, at most
 * COMMON_START_ROUNDS times. */
#define COMMON_START_ROUNDS 4

static void common_start(qrt_client *const *c)
{
	int64_t s = req.not_before_ns;
	char why[QRT_SLURM_MSG] = "";
	for (int round = 0; round < COMMON_START_ROUNDS; ++round) {
		int latest = 0;
		for (int i = 0; i < n_nodes; ++i) {
			char none[512] = "";
			const int64_t e = earliest_start(c[i], s, none, sizeof(none));
			if (e == 0) {
				fail_with("qrt: no common start for this step: qrtd on %s has no slot "
					  "of %" PRId64 " ns at or after %" PRId64 ": %s",
					  nodes[i].name, req.duration_ns, s, none);
				return;
			}
			if (e > s) {
				s = e;
				latest = i;
			}
		}
		if (s + req.duration_ns > req.deadline_ns) {
			char at[80];
			char dl[80];
			format_ns(s, at, sizeof(at));
			format_ns(req.deadline_ns, dl, sizeof(dl));
			fail_with("qrt: no common start for this step: node %s's earliest start %s "
				  "leaves no slot of %" PRId64 " ns before the deadline %s (%s); "
				  "nothing was reserved",
				  nodes[latest].name, at, req.duration_ns, dl,
				  req.deadline_from_job ? "the job's time limit" : "--qpu-deadline");
			return;
		}
		char k[192];
		if (round == 0) {
			snprintf(k, sizeof(k), "%s", key);
		} else {
			snprintf(k, sizeof(k), "%s#%d", key, round);
		}
		int ok = 1;
		int again = 1;
		for (int i = 0; i < n_nodes && ok; ++i) {
			qrt_error err;
			if (reserve_into(c[i], s, s + req.duration_ns, k, &nodes[i].h, &err) < 0) {
				snprintf(why, sizeof(why), "%s refused the hold at %" PRId64 ": %s "
					 "(reason %s)", nodes[i].name, s, err.message, err.reason);
				note("qrt: %s: round %d: %s", key, round + 1, why);
				ok = 0;
				/* Only a slot taken since the query is worth another
				 * round; a quota, a role or a bad request is not. */
				again = strcmp(err.reason, "no_fit") == 0;
			} else if (nodes[i].h.start_ns != s) {
				snprintf(why, sizeof(why), "%s placed the hold at %" PRId64 ", not %"
					 PRId64, nodes[i].name, nodes[i].h.start_ns, s);
				nodes[i].have = 1;
				ok = 0;
			} else {
				nodes[i].have = 1;
			}
		}
		if (ok) {
			return;
		}
		release_local(again ? "common start retry" : "common start refused");
		for (int i = 0; i < n_nodes; ++i) {
			if (nodes[i].have) {
				fail_with("qrt: no common start for this step, and the hold on %s could "
					  "not be released (its lease ends it): %s",
					  nodes[i].name, why);
				return;
			}
		}
		if (!again) {
			fail_with("qrt: no common start for this step: %s; every hold made was "
				  "released", why);
			return;
		}
	}
	fail_with("qrt: no common start for this step after %d rounds: %s; nothing is held",
		  COMMON_START_ROUNDS, why);
}

/* srun's heartbeat (lease=): every third of the lease, slots.heartbeat on
 * every hold srun made that is still held; a committed one has no lease
 * and is left alone.  Ends when srun's exit sets heartbeat_stop. */
static void *heartbeat_main(void *arg)
{
	(void)arg;
	const int64_t every = cfg.heartbeat_lease_ns / 3;
	int done[MAX_NODES] = {0};
	pthread_mutex_lock(&heartbeat_mu);
	while (!heartbeat_stop) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		const int64_t t = (int64_t)until.tv_sec * 1000000000 + until.tv_nsec + every;
		until.tv_sec = (time_t)(t / 1000000000);
		until.tv_nsec = (long)(t % 1000000000);
		while (!heartbeat_stop &&
		       pthread_cond_timedwait(&heartbeat_cv, &heartbeat_mu, &until) == 0) {
		}
		if (heartbeat_stop) {
			break;
		}
		pthread_mutex_unlock(&heartbeat_mu);
		for (int i = 0; i < n_nodes; ++i) {
			if (!nodes[i].have || done[i]) {
				continue;
			}
			qrt_error err;
			qrt_reservation r;
			qrt_client *c = connect_to(nodes[i].url, &err);
			if (c == NULL) {
				note("qrt: %s: heartbeat: cannot reach %s: %s", key, nodes[i].url,
				     err.message);
				continue;
			}
			if (qrt_slots_heartbeat(c, nodes[i].h.member[0].id, nodes[i].h.fencing_token,
						&r, &err) == 0) {
				nodes[i].h.lease_expires_ns = r.lease_expires_ns;
			} else if (strcmp(err.reason, "illegal_transition") == 0) {
				done[i] = 1; /* committed (or over): no lease to renew */
			} else {
				note("qrt: %s: heartbeat of %" PRIu64 " on %s: %s (%s)", key,
				     nodes[i].h.member[0].id, nodes[i].name, err.message, err.reason);
			}
			qrt_close(c);
		}
		pthread_mutex_lock(&heartbeat_mu);
	}
	pthread_mutex_unlock(&heartbeat_mu);
	return NULL;
}

static void heartbeat_end(void)
{
	if (!heartbeat_running) {
		return;
	}
	pthread_mutex_lock(&heartbeat_mu);
	heartbeat_stop = 1;
	pthread_cond_signal(&heartbeat_cv);
	pthread_mutex_unlock(&heartbeat_mu);
	pthread_join(heartbeat_thread, NULL);
	heartbeat_running = 0;
}

/* srun, once per step after the allocation, before any task: for a tcp://
 * qrtd (a QPU node reached from compute nodes) one reservation for the
 * whole step; with qrtd_node= one reservation per node at one common
 * start.  What the tasks need goes into the environment srun sends them;
 * a failure too (QRT_FAILURE), so that each node refuses its tasks with it
 * before they run. */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (opts.duration_ns <= 0 || cfg_error[0] != '\0' || opt_error[0] != '\0') {
		return 0; /* the remote side reports */
	}
	if (get_u32(sp, S_JOB_ID, &job_id) < 0 || get_u32(sp, S_JOB_STEPID, &step_id) < 0) {
		return 0; /* the remote side decides */
	}
	const int tcp = strncmp(cfg.socket, "tcp://", 6) == 0;
	if (cfg.node_url[0] == '\0' && !tcp) {
		return 0; /* a local qrtd on each node: slurmstepd reserves, as before */
	}
	prepare_request(sp);
	const char *env_key = getenv("QRT_IDEMPOTENCY_KEY");
	const char *env_req = getenv("QRT_REQUEST");
	if (env_key != NULL && env_req != NULL && qrt_slurm_key_is_job(env_key, cluster, job_id) &&
	    strcmp(env_key, key) != 0 && strcmp(env_req, request_text) == 0) {
		return 0; /* an outer step (the batch script) holds it */
	}
	static char names[MAX_NODES][64];
	const int n = cfg.node_url[0] != '\0' ? step_nodes(names, MAX_NODES) : 0;
	if (cfg.node_url[0] != '\0' && n < 0) {
		slurm_error("qrt: %s: cannot list the step's nodes (at most %d for a common start); "
			    "qrtd_node= not used", key, MAX_NODES);
	}
	const int per_node = nodes_have_qrtd(names, n);
	if (!per_node && !tcp) {
		return 0; /* nodes outside qrtd_nodes with a local qrtd each */
	}
	snprintf(step_socket, sizeof(step_socket), "%s", cfg.socket);
	local_reserved = 1;
	unsetenv("QRT_NODE_RESERVATIONS");
	unsetenv("QRT_FAILURE");
	build_request();
	if (cfg.heartbeat_lease_ns > 0 && cfg.heartbeat_lease_ns < req.lease_ns) {
		/* srun renews it: the slot may still end as late as the job. */
		req.lease_ns = cfg.heartbeat_lease_ns;
	}
	qrt_client *c[MAX_NODES] = {NULL};
	if (failure[0] == '\0' && per_node) {
		n_nodes = n;
		for (int i = 0; i < n && failure[0] == '\0'; ++i) {
			qrt_error err;
			snprintf(nodes[i].name, sizeof(nodes[i].name), "%.63s", names[i]);
			if (qrt_slurm_node_url(&cfg, names[i], nodes[i].url, sizeof(nodes[i].url)) < 0) {
				fail_with("qrt: qrtd_node= for %s is too long", names[i]);
			} else if ((c[i] = connect_to(nodes[i].url, &err)) == NULL) {
				fail_with("qrt: cannot reach qrtd of node %s at %s: %s (reason %s)",
					  names[i], nodes[i].url, err.message, err.reason);
			}
		}
		if (failure[0] == '\0') {
			common_start(c);
		}
	} else if (failure[0] == '\0') {
		n_nodes = 1;
		snprintf(nodes[0].name, sizeof(nodes[0].name), "%.63s", cfg.socket);
		snprintf(nodes[0].url, sizeof(nodes[0].url), "%s", cfg.socket);
		qrt_error err;
		if ((c[0] = connect_to(cfg.socket, &err)) == NULL) {
			fail_with("qrt: cannot reach qrtd at %s: %s (reason %s)", cfg.socket,
				  err.message, err.reason);
		} else {
			reserve(c[0]);
			if (have_held) {
				nodes[0].h = held;
				nodes[0].have = 1;
			}
		}
	}
	for (int i = 0; i < MAX_NODES; ++i) {
		if (c[i] != NULL) {
			qrt_close(c[i]);
		}
	}
	setenv("QRT_RESERVED_BY", "srun", 1);
	setenv("QRT_IDEMPOTENCY_KEY", key, 1);
	setenv("QRT_REQUEST", request_text, 1);
	if (failure[0] != '\0') {
		release_local("step refused");
		slurm_error("%s", failure);
		setenv("QRT_FAILURE", failure, 1);
		return 0;
	}
	if (cfg.heartbeat_lease_ns > 0 &&
	    pthread_create(&heartbeat_thread, NULL, heartbeat_main, NULL) == 0) {
		heartbeat_running = 1;
	} else if (cfg.heartbeat_lease_ns > 0) {
		slurm_error("qrt: %s: cannot start the heartbeat thread; the lease may end "
			    "before the step", key);
	}
	if (!per_node) {
		export_held(sp);
		return 0;
	}
	/* Each node exports its own entry's ids and socket; the times are
	 * common. */
	static char entries[MAX_NODES * 128];
	size_t at = 0;
	for (int i = 0; i < n_nodes; ++i) {
		char one[QRT_SLURM_MAX_GANG * 90 + 128];
		if (qrt_slurm_node_entry_format(nodes[i].name, &nodes[i].h, one, sizeof(one)) < 0 ||
		    at + strlen(one) + 2 > sizeof(entries)) {
			release_local("step refused");
			setenv("QRT_FAILURE", "qrt: the step's reservations are too many to export", 1);
			return 0;
		}
		at += (size_t)snprintf(entries + at, sizeof(entries) - at, "%s%s", i ? ";" : "", one);
	}
	held = nodes[0].h;
	have_held = 1;
	char num[32];
	setenv("QRT_NODE_RESERVATIONS", entries, 1);
	snprintf(num, sizeof(num), "%" PRId64, held.start_ns);
	setenv("QRT_SLOT_START_NS", num, 1);
	snprintf(num, sizeof(num), "%" PRId64, held.end_ns);
	setenv("QRT_SLOT_END_NS", num, 1);
	snprintf(num, sizeof(num), "%" PRId64, held.start_ns - cfg.submit_lead_ns);
	setenv("QRT_SUBMIT_BY_NS", num, 1);
	snprintf(num, sizeof(num), "%" PRId64, held.lease_expires_ns);
	setenv("QRT_LEASE_EXPIRES_NS", num, 1);
	note("qrt: %s: common start %" PRId64 " on %d nodes", key, held.start_ns, n_nodes);
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (mode == MODE_OFF || cfg_error[0] != '\0' || failure[0] != '\0') {
		return 0; /* task_init reports */
	}
	if (mode == MODE_INHERIT && !qrt_slurm_checks_cpuset(&cfg)) {
		return 0; /* srun or an outer step holds the slot */
	}
	qrt_error err;
	qrt_client *c = connect_qrtd(&err);
	if (c == NULL) {
		char host[64] = "this node";
		gethostname(host, sizeof(host));
		fail_with("qrt: cannot reach qrtd at %s on %s: %s (reason %s)", cfg.socket, host,
			  err.message, err.reason);
		return 0;
	}
	if (qrt_slurm_checks_cpuset(&cfg)) {
		read_isolated(c);
	}
	if (mode == MODE_OWN) {
		reserve(c);
		if (have_held) {
			export_held(sp);
		}
	} else if (mode == MODE_NODE) {
		export_held(sp);
	}
	/* Close before the tasks are forked: they must not inherit it. */
	qrt_close(c);
	return 0;
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	if (mode == MODE_OWN && have_held && !state_written) {
		write_state();
	}
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (mode == MODE_OFF) {
		return 0;
	}
	int local_id = 0;
	spank_get_item(sp, S_TASK_ID, &local_id);
	const char *why = cfg_error[0] != '\0' ? cfg_error : failure[0] != '\0' ? failure : NULL;
	if (why != NULL) {
		if (local_id == 0) {
			dprintf(STDERR_FILENO, "%s\n", why);
		}
		return -1;
	}
	if (qrt_slurm_checks_cpuset(&cfg) && isolated_known) {
		qrt_slurm_cpus mine;
		char both[256];
		char all[256];
		char iso[256];
		if (task_cpuset(&mine) == 0 &&
		    qrt_slurm_cpus_overlap(&mine, &isolated, both, sizeof(both)) > 0) {
			if (local_id == 0) {
				qrt_slurm_cpus_text(&mine, all, sizeof(all));
				qrt_slurm_cpus_text(&isolated, iso, sizeof(iso));
				dprintf(STDERR_FILENO,
					"qrt: refusing this step: its cpuset (CPUs %s) overlaps CPU%s %s "
					"that qrtd isolated for QPU dispatch on this node (isolated: "
					"%s). Slurm must keep jobs off them: add the lines of `qrtd "
					"host plan --slurm` to slurm.conf (CpuSpecList, "
					"TaskPlugin=task/affinity,task/cgroup) and cgroup.conf "
					"(ConstrainCores=yes)\n",
					all, strchr(both, ',') || strchr(both, '-') ? "s" : "", both,
					iso);
			}
			return -1;
		}
	}
	return 0;
}

static void release_once(const char *who)
{
	if ((mode != MODE_OWN && mode != MODE_NODE) || !have_held || released) {
		return;
	}
	if (give_back(&held, who) == 0) {
		released = 1;
		if (mode == MODE_OWN) {
			remove_state(job_id, step_id);
		}
	}
}

/* The last local task has exited: the step's use of the slot is over.
 * Releasing here, not only in exit, spares the seconds slurmstepd may
 * still spend reaping the step's other processes (scancel). */
int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	uint32_t ntasks = 0;
	if (spank_remote(sp) != 1 || get_u32(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) < 0) {
		return 0;
	}
	if (++tasks_exited >= ntasks) {
		release_once("last task exit");
	}
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp) == 1) {
		release_once("step end");
	} else if (spank_context() == S_CTX_LOCAL && local_reserved) {
		/* srun: the step is over on every node. */
		heartbeat_end();
		release_local("srun exit");
	}
	return 0;
}

/* slurmd's job epilog (job_script context, root): what a step left behind
 * when its slurmstepd died, or when qrtd could not be told at its end.
 * Never fails: a non-zero job_epilog drains the node. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t job = 0;
	char prefix[32];
	parse_args(ac, av);
	if (cfg_error[0] != '\0' || get_u32(sp, S_JOB_ID, &job) < 0) {
		return 0;
	}
	snprintf(prefix, sizeof(prefix), "%" PRIu32 ".", job);
	DIR *d = opendir(cfg.state_dir);
	if (d == NULL) {
		return 0; /* no step of any job left anything */
	}
	struct stat dst;
	if (fstat(dirfd(d), &dst) < 0 || dst.st_uid != 0 || (dst.st_mode & 022) != 0) {
		slurm_error("qrt: job epilog: %s is not root's alone; ignored", cfg.state_dir);
		closedir(d);
		return 0;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
		    strstr(e->d_name, ".tmp") != NULL) {
			continue;
		}
		const int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		struct stat st;
		char text[QRT_SLURM_MAX_GANG * 90 + 512];
		if (fd < 0) {
			continue;
		}
		ssize_t n = -1;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
		    (st.st_mode & 022) == 0) {
			n = read(fd, text, sizeof(text) - 1);
		}
		close(fd);
		qrt_slurm_held h;
		if (n <= 0) {
			continue;
		}
		text[n] = '\0';
		if (qrt_slurm_state_parse(text, &h) < 0) {
			slurm_error("qrt: job epilog: %s/%s does not parse; removed", cfg.state_dir,
				    e->d_name);
			unlinkat(dirfd(d), e->d_name, 0);
			continue;
		}
		if (give_back(&h, "job epilog") == 0) {
			unlinkat(dirfd(d), e->d_name, 0);
		}
	}
	closedir(d);
	return 0;
}
