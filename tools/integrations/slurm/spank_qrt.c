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
 *                         restarted slurmstepd repeats the same request),
 *                         the job's end (its time limit), ClusterName and,
 *                         for a common start, this node's name
 *   user_init      user   connect to qrtd AS THE JOB'S USER (seteuid'd:
 *                         SO_PEERCRED names the user, so the reservation
 *                         belongs to the uid whose tasks submit into it),
 *                         read the isolated CPUs, reserve, export QRT_*
 *   task_post_fork root   write the step's state file for the job epilog
 *   task_init      user   in each task before exec: fail the task when the
 *                         reservation failed or its cpuset overlaps the
 *                         isolated CPUs, with the reason on its stderr
 *   task_exit      root   after the last local task: give the slot back
 *                         (release a held one, cancel a committed one) from
 *                         a child that became the job's user first
 *                         (spank_qrt_user.c): root never calls qrtd
 *   exit           root   the same, if task_exit could not
 *   job_epilog     root   (slurmd, job_script context) give back, the same
 *                         way, whatever a step left behind in its state
 *                         file (slurmstepd killed, qrtd down)
 *
 * srun's side (local context) is spank_qrt_srun.c.
 *
 * The job's environment is the user's to write: nothing root acts on comes
 * from it.  The cluster name is plugstack.conf's cluster= or slurm.conf's
 * ClusterName (never SLURM_CLUSTER_NAME); a common-start node's qrtd is
 * qrtd_node= for this node's name as slurmctld has it (never the node an
 * entry of QRT_NODE_RESERVATIONS names); and the ids and token of that
 * entry are used only by the child that gave up root for the job's user.
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

#include "spank_qrt.h"
#include <qrt/names.h>

SPANK_PLUGIN(qrt, 1)

/* One slurmstepd serves one step: module state is the step's state
 * (spank_qrt.h). */
qrt_slurm_config cfg;
char cfg_error[QRT_SLURM_MSG];
/* Set by the option callbacks, which in slurmstepd run BEFORE
 * slurm_spank_init: the defaults are static. */
qrt_slurm_options opts = {.count = 1};
char opt_error[QRT_SLURM_MSG];
enum step_mode mode = MODE_OFF;
uint32_t job_id;
uint32_t step_id;
char cluster[64];
char key[160];
char request_text[256];
qrt_slurm_request req;
qrt_slurm_held held;
int have_held;
char failure[QRT_SLURM_MSG];
char step_socket[256];
static qrt_slurm_cpus isolated;
static int isolated_known;
static int state_written;
static int released;
static uint32_t tasks_exited;
/* Whom the step's slot is given back as (MODE_OWN, MODE_NODE). */
static job_user step_user;
static int step_user_known;

int64_t realtime_ns(void)
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

int get_u32(spank_t sp, spank_item_t item, uint32_t *out)
{
	return spank_get_item(sp, item, out) == ESPANK_SUCCESS ? 0 : -1;
}

void parse_args(int ac, char **av)
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

void fail_with(const char *fmt, ...)
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

int export_held(spank_t sp)
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

qrt_client *connect_to(const char *url, qrt_error *err)
{
	return qrt_slurm_connect(url, cfg.timeout_ms, err);
}

static qrt_client *connect_qrtd(qrt_error *err)
{
	return connect_to(step_socket[0] != '\0' ? step_socket : cfg.socket, err);
}

/* The next start qrtd could give this request, ignoring the deadline (for
 * the message of a reservation that did not fit), or 0. */
static int64_t next_possible_start(qrt_client *c)
{
	return earliest_start(c, req.not_before_ns, NULL, 0);
}

/* The earliest start qrtd could give this request at or after
 * not_before_ns, ignoring the deadline, or 0 (why says why). */
int64_t earliest_start(qrt_client *c, int64_t not_before_ns, char *why, size_t why_len)
{
	return qrt_slurm_earliest_start(c, &req, not_before_ns, why, why_len);
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
 * deadline_ns under idempotency key k: 0 and *h (its key the step's), or
 * -1 and *err. */
int reserve_into(qrt_client *c, int64_t not_before_ns, int64_t deadline_ns,
			const char *k, qrt_slurm_held *h, qrt_error *err)
{
	if (qrt_slurm_reserve(c, &req, not_before_ns, deadline_ns, k, h, err) < 0) {
		return -1;
	}
	snprintf(h->key, sizeof(h->key), "%s", key);
	char ids[256];
	qrt_slurm_ids_text(h, ids, sizeof(ids));
	note("qrt: %s: reserved %s (%d QPU%s) start_ns %" PRId64 " end_ns %" PRId64
		   " lease until %" PRId64,
		   k, ids, h->n, h->n == 1 ? "" : "s", h->start_ns, h->end_ns, h->lease_expires_ns);
	return 0;
}

void reserve(qrt_client *c)
{
	qrt_error err;
	if (reserve_into(c, req.not_before_ns, req.deadline_ns, key, &held, &err) < 0) {
		char msg[QRT_SLURM_MSG];
		const int64_t next = strcmp(err.reason, QRT_REASON_NO_FIT) == 0 ||
					     strcmp(err.reason, QRT_REASON_DEADLINE_PASSED) == 0
				     ? next_possible_start(c)
				     : 0;
		qrt_slurm_failure_message(&req, err.reason, err.message, next, realtime_ns(), msg,
					  sizeof(msg));
		fail_with("%s", msg);
		return;
	}
	have_held = 1;
}

/* Give the step's slot back at its qrtd, as the job's user. */
static int give_back(const qrt_slurm_held *h, const char *who)
{
	if (!step_user_known) {
		slurm_error("qrt: %s: %s: the job's user is not known; not given back (its lease "
			    "ends it)", who, h->key);
		return -1;
	}
	return give_back_as(&step_user, step_socket[0] != '\0' ? step_socket : cfg.socket, h, who);
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
 * when it cannot be made).  The key's cluster name is plugstack.conf's
 * cluster=, else slurm.conf's ClusterName as slurmctld has it: never
 * SLURM_CLUSTER_NAME, which is the job's environment, the user's to write
 * (and root writes the key into the state file).  srun and slurmstepd ask
 * the same, so their keys agree. */
void prepare_request(spank_t sp)
{
	(void)sp;
	snprintf(cluster, sizeof(cluster), "-");
	if (cfg.cluster[0] != '\0') {
		snprintf(cluster, sizeof(cluster), "%s", cfg.cluster);
	} else {
		slurm_conf_t *conf = NULL;
		if (slurm_load_ctl_conf((time_t)0, &conf) != SLURM_SUCCESS || conf == NULL) {
			note("qrt: slurm.conf's ClusterName is unknown (slurm_load_ctl_conf: %s); the "
			     "key's cluster is '-'", slurm_strerror(slurm_get_errno()));
		} else if (conf->cluster_name != NULL && conf->cluster_name[0] != '\0') {
			if (!qrt_slurm_cluster_ok(conf->cluster_name)) {
				fail_with("qrt: slurm.conf's ClusterName is not a name for the step's key "
					  "(1 to %zu letters, digits, '.', '_' or '-'); the site must set "
					  "cluster= in plugstack.conf", sizeof(cluster) - 1);
			} else {
				snprintf(cluster, sizeof(cluster), "%s", conf->cluster_name);
			}
		}
		if (conf != NULL) {
			slurm_free_ctl_conf(conf);
		}
	}
	if (qrt_slurm_key(cluster, job_id, step_id, key, sizeof(key)) < 0) {
		fail_with("qrt: the step's key for cluster '%s' does not fit", cluster);
	}
	qrt_slurm_request_text(&opts, request_text, sizeof(request_text));
}

void build_request(void)
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

/* This node's name in the step (its relative id), as slurmctld has it. */
static int this_node(uint32_t node_id, char *name, size_t len)
{
	static char names[MAX_NODES][64];
	const int n = step_nodes(names, MAX_NODES);
	if (n < 0 || node_id >= (uint32_t)n) {
		return -1;
	}
	snprintf(name, len, "%s", names[node_id]);
	return 0;
}

/* slurmstepd of a step whose srun reserved (QRT_RESERVED_BY=srun and this
 * step's key in the environment): 1 when it did, with mode set.
 *
 * All of it is the job's environment, which the user writes: for a common
 * start this node's entry of QRT_NODE_RESERVATIONS (ids, token) is exported
 * to the tasks and given back at the end only by a child that became the
 * job's user (give_back_as), so it can name nothing the user could not act
 * on directly; and the qrtd it is given back at is this node's own:
 * qrtd_node= with this node's name from slurmctld, never the node the entry
 * names. */
static int srun_reserved(spank_t sp)
{
	char by[16];
	char env_key[160];
	static char text[MAX_NODES * 128];
	if (spank_getenv(sp, "QRT_RESERVED_BY", by, sizeof(by)) != ESPANK_SUCCESS ||
	    strcmp(by, "srun") != 0 ||
	    spank_getenv(sp, "QRT_IDEMPOTENCY_KEY", env_key, sizeof(env_key)) != ESPANK_SUCCESS ||
	    strcmp(env_key, key) != 0) {
		return 0;
	}
	mode = MODE_INHERIT;
	if (spank_getenv(sp, "QRT_FAILURE", text, sizeof(text)) == ESPANK_SUCCESS &&
	    text[0] != '\0') {
		fail_with("%.*s", QRT_SLURM_MSG - 1, text);
		return 1;
	}
	const spank_err_t got = spank_getenv(sp, "QRT_NODE_RESERVATIONS", text, sizeof(text));
	if (got == ESPANK_ENV_NOEXIST) {
		return 1; /* one shared reservation: srun holds and releases it */
	}
	/* A common start: this node's entry, by its relative id in the step. */
	uint32_t node_id = 0;
	char node[64];
	char own[64];
	char num[32];
	if (cfg.node_url[0] == '\0') {
		fail_with("qrt: this step's environment has QRT_NODE_RESERVATIONS, but plugstack.conf "
			  "has no qrtd_node=: srun made no common start; refusing the step");
		return 1;
	}
	if (got != ESPANK_SUCCESS) {
		fail_with("qrt: this step's QRT_NODE_RESERVATIONS cannot be read (%s)",
			  spank_strerror(got));
		return 1;
	}
	if (get_u32(sp, S_JOB_NODEID, &node_id) < 0 || this_node(node_id, own, sizeof(own)) < 0) {
		fail_with("qrt: slurmctld does not name node %" PRIu32 " of this step (at most %d "
			  "nodes for a common start)", node_id, MAX_NODES);
		return 1;
	}
	if (qrt_slurm_node_entry_parse(text, (int)node_id, node, sizeof(node), &held) < 0) {
		fail_with("qrt: srun's QRT_NODE_RESERVATIONS has no entry for node %" PRIu32
			  " (%s) of this step", node_id, own);
		return 1;
	}
	if (strcmp(node, own) != 0) {
		fail_with("qrt: QRT_NODE_RESERVATIONS's entry %" PRIu32 " is for node '%.63s', but "
			  "this is %s: srun did not make it; refusing the step", node_id, node, own);
		return 1;
	}
	if (!nodes_have_qrtd(&own, 1)) {
		fail_with("qrt: node %s is not in plugstack.conf's qrtd_nodes=, so srun made no "
			  "common start on it; refusing the step", own);
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
	if (qrt_slurm_node_url(&cfg, own, step_socket, sizeof(step_socket)) < 0) {
		fail_with("qrt: qrtd_node= for %s is too long", own);
		return 1;
	}
	have_held = 1;
	mode = MODE_NODE;
	slurm_info("qrt: %s: node %s uses reservation %" PRIu64 " at %s (common start %" PRId64
		   ")", key, own, held.member[0].id, step_socket, held.start_ns);
	return 1;
}

/* What the step does (mode), with its key and request. */
static void decide(spank_t sp)
{
	snprintf(step_socket, sizeof(step_socket), "%s", cfg.socket);
	if (get_u32(sp, S_JOB_ID, &job_id) < 0 || get_u32(sp, S_JOB_STEPID, &step_id) < 0) {
		slurm_error("qrt: cannot read the job and step ids");
		mode = MODE_OWN;
		fail_with("qrt: the plugin could not read this step's job and step ids");
		return;
	}
	if (step_id == QRT_SLURM_STEP_EXTERN) {
		return; /* the extern step runs no user task */
	}
	prepare_request(sp);
	if (outer_step_holds(sp)) {
		mode = MODE_INHERIT;
		slurm_info("qrt: %s: uses the slot of an outer step", key);
		return;
	}
	if (srun_reserved(sp)) {
		return;
	}
	mode = MODE_OWN;
	if (opt_error[0] != '\0') {
		fail_with("%s", opt_error);
		return;
	}
	build_request();
}

/* The step's own slot (MODE_OWN) or its node's part (MODE_NODE) is given
 * back as the job's user: who that is, while root can still ask. */
static void learn_step_user(spank_t sp)
{
	char why[256];
	if (mode != MODE_OWN && mode != MODE_NODE) {
		return;
	}
	if (job_user_of_step(sp, &step_user, why, sizeof(why)) < 0) {
		fail_with("qrt: the plugin could not learn the job's user (%s), whom it gives the "
			  "slot back as", why);
		return;
	}
	step_user_known = 1;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp) != 1 || opts.duration_ns <= 0) {
		return 0;
	}
	decide(sp);
	learn_step_user(sp);
	return 0;
}

/* ------------------------------------------------------------ the step's nodes */

/* The step's nodes, in its order (the relative node ids), from slurmctld;
 * srun (the user's own process) also from its environment.  slurmstepd
 * never: the job's environment is the user's to write.  Their count, or
 * -1. */
int step_nodes(char names[][64], int cap)
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
	if (list[0] == '\0' && spank_context() == S_CTX_LOCAL) {
		const char *env = getenv("SLURM_STEP_NODELIST");
		if (env == NULL) {
			env = getenv("SLURM_JOB_NODELIST");
		}
		if (env == NULL) {
			return -1;
		}
		snprintf(list, sizeof(list), "%s", env);
	}
	if (list[0] == '\0') {
		return -1;
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
int nodes_have_qrtd(char names[][64], int n)
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

/* ------------------------------------------------------------ callbacks, continued */

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
		state_written = write_state() == 0;
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
	} else if (spank_context() == S_CTX_LOCAL) {
		srun_exit();
	}
	return 0;
}
