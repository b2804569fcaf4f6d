/*
 * spank_qrt_srun.c: spank_qrt.so in srun (local context), only for
 * socket=tcp:// (a QPU node reached from compute nodes) or qrtd_node= (each
 * node its own qrtd):
 *
 *   local_user_init  user  after the allocation, before any task: ONE
 *                         reservation for the step on the remote qrtd, or
 *                         one per node at a common start; QRT_* (or
 *                         QRT_FAILURE) into the environment the tasks get
 *   exit             user  release what srun made, after every node's tasks
 *
 * srun runs as the job's user: what it makes and gives back is that user's.
 * The nodes then inherit (MODE_INHERIT) or take their own part of a common
 * start (MODE_NODE).  Leases end by the job's time limit (at most
 * max_lease); with lease= srun's are that short instead and a thread in
 * srun renews them, so a dead srun leaves its slots to expiry soon.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "spank_qrt.h"
#include <qrt/names.h>

/* What srun reserved for the step, released at its exit. */
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
/* The heartbeat thread's connection subscribed to
 * reservation.yield_requested (a step with one reservation, lease=), opened
 * before any task starts; NULL without one. */
static qrt_client *yield_watch;
/* How often the step's hold moved for a calibration block (its keys). */
static int yield_moves;

/* srun is the job's user: it gives back what it made itself. */
static void release_local(const char *who)
{
	for (int i = 0; i < n_nodes; ++i) {
		char msg[QRT_SLURM_MSG];
		int is_error = 0;
		if (!nodes[i].have) {
			continue;
		}
		if (give_back_at(nodes[i].url, &nodes[i].h, who, msg, sizeof(msg), &is_error) == 0) {
			nodes[i].have = 0;
		}
		if (is_error) {
			slurm_error("%s", msg);
		} else {
			note("%s", msg);
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
				again = strcmp(err.reason, QRT_REASON_NO_FIT) == 0;
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

/* Subscribe the step's one hold to reservation.yield_requested at url,
 * before any task starts (so no request comes unheard): the heartbeat
 * thread then reads it. */
static void yield_watch_open(const char *url)
{
	qrt_error err;
	qrt_client *c = connect_to(url, &err);
	if (c == NULL) {
		slurm_error("qrt: %s: cannot reach %s to hear calibration yield requests: %s; "
			    "the hold will not move for a calibration block", key, url, err.message);
		return;
	}
	if (qrt_call(c, "events.subscribe",
		     "{\"topics\":[\"" QRT_EVENT_RESERVATION_YIELD_REQUESTED "\"]}", NULL,
		     &err) < 0) {
		slurm_error("qrt: %s: events.subscribe at %s: %s (%s); the hold will not move for "
			    "a calibration block", key, url, err.message, err.reason);
		qrt_close(c);
		return;
	}
	yield_watch = c;
}

/* qrtd asked the step's hold to yield to calibration block y->block_id
 * (qrtd(8), CALIBRATION BLOCKS, Yield): release it and reserve the same
 * request again at or after the nearest free start past the block, under
 * the step's key with "#yN"; the user reads one line naming the block and
 * the new start.  When no slot is left the step fails with the reason, as
 * a refused reservation fails it at srun's start (its tasks are killed). */
static void move_for_yield(const qrt_yield_request *y)
{
	struct node_hold *n = &nodes[0];
	if (!n->have || y->reservation_id != n->h.member[0].id) {
		return; /* another reservation of this user's, or given back */
	}
	const int64_t from = y->free_start_ns > 0 ? y->free_start_ns : y->block_end_ns;
	qrt_error err;
	qrt_client *c = connect_to(n->url, &err);
	if (c == NULL) {
		slurm_error("qrt: %s: calibration block %" PRIu64 " asks for the step's slot, but "
			    "%s cannot be reached: %s; the hold stays (the block's deadline decides)",
			    key, y->block_id, n->url, err.message);
		return;
	}
	/* A release, never give_back_at: a job the task committed meanwhile
	 * is acknowledged and stays (qrtd then fails the block). */
	if (qrt_slots_release(c, n->h.member[0].id, n->h.fencing_token, &err) < 0) {
		if (strcmp(err.reason, QRT_REASON_ILLEGAL_TRANSITION) != 0) {
			slurm_error("qrt: %s: calibration block %" PRIu64 " asks for the step's slot; "
				    "slots.release %" PRIu64 ": %s (%s); the hold stays", key,
				    y->block_id, n->h.member[0].id, err.message, err.reason);
		}
		qrt_close(c);
		return;
	}
	n->have = 0;
	char k[192];
	snprintf(k, sizeof(k), "%s#y%d", key, ++yield_moves);
	qrt_slurm_held h;
	const int rc = reserve_into(c, from, req.deadline_ns, k, &h, &err);
	if (rc == 0) {
		char at[48];
		qrt_slurm_format_utc(h.start_ns, at, sizeof(at));
		n->h = h;
		n->have = 1;
		slurm_info("qrt: %s: calibration block %" PRIu64 " (step %s) on qpu %s took the "
			   "step's slot; it moved to start %s (%" PRId64 "), reservation %" PRIu64,
			   key, y->block_id, y->step, y->qpu, at, h.start_ns, h.member[0].id);
	} else {
		char why[QRT_SLURM_MSG];
		const int64_t next = strcmp(err.reason, QRT_REASON_NO_FIT) == 0 ||
					     strcmp(err.reason, QRT_REASON_DEADLINE_PASSED) == 0
				     ? earliest_start(c, from, NULL, 0)
				     : 0;
		qrt_slurm_failure_message(&req, err.reason, err.message, next, realtime_ns(), why,
					  sizeof(why));
		slurm_error("qrt: %s: calibration block %" PRIu64 " (step %s) on qpu %s took the "
			    "step's slot, and no other is left: %s", key, y->block_id, y->step,
			    y->qpu, why);
		if (slurm_kill_job_step(job_id, step_id, SIGKILL) != SLURM_SUCCESS) {
			slurm_error("qrt: %s: cannot end the step: %s", key,
				    slurm_strerror(slurm_get_errno()));
		}
	}
	qrt_close(c);
}

/* Until the next heartbeat (or stop): wait on heartbeat_cv, or, with a
 * yield watch, read its events in slices and act on each yield request.
 * Called and returns with heartbeat_mu held. */
static void heartbeat_wait(int64_t every)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	const int64_t t = (int64_t)until.tv_sec * 1000000000 + until.tv_nsec + every;
	until.tv_sec = (time_t)(t / 1000000000);
	until.tv_nsec = (long)(t % 1000000000);
	while (!heartbeat_stop && yield_watch != NULL) {
		const int64_t left = t - realtime_ns();
		if (left <= 0) {
			return;
		}
		pthread_mutex_unlock(&heartbeat_mu);
		char *ev = NULL;
		qrt_error err;
		const int slice_ms = left > 250000000 ? 250 : (int)(left / 1000000) + 1;
		const int rc = qrt_next_event(yield_watch, slice_ms, &ev, &err);
		qrt_yield_request y;
		if (rc == 0 && qrt_yield_request_read(ev, &y) == 0) {
			move_for_yield(&y);
		} else if (rc < 0 && rc != -ETIMEDOUT) {
			slurm_error("qrt: %s: the connection that hears calibration yield requests "
				    "ended: %s; the hold will not move for a calibration block", key,
				    err.message);
			qrt_close(yield_watch);
			yield_watch = NULL;
		}
		qrt_free(ev);
		pthread_mutex_lock(&heartbeat_mu);
	}
	while (!heartbeat_stop &&
	       pthread_cond_timedwait(&heartbeat_cv, &heartbeat_mu, &until) == 0) {
	}
}

/* srun's heartbeat (lease=): every third of the lease, slots.heartbeat on
 * every hold srun made that is still held; a committed one has no lease
 * and is left alone.  Between heartbeats it hears yield requests for the
 * step's hold (yield_watch).  Ends when srun's exit sets heartbeat_stop. */
static void *heartbeat_main(void *arg)
{
	(void)arg;
	const int64_t every = cfg.heartbeat_lease_ns / 3;
	int done[MAX_NODES] = {0};
	pthread_mutex_lock(&heartbeat_mu);
	while (!heartbeat_stop) {
		heartbeat_wait(every);
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
			} else if (strcmp(err.reason, QRT_REASON_ILLEGAL_TRANSITION) == 0) {
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
	qrt_close(yield_watch);
	yield_watch = NULL;
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
	if (cfg.heartbeat_lease_ns > 0 && !per_node) {
		/* One hold: it may move for a calibration block.  A common start
		 * does not move (its nodes' holds would part). */
		yield_watch_open(nodes[0].url);
	}
	if (cfg.heartbeat_lease_ns > 0 &&
	    pthread_create(&heartbeat_thread, NULL, heartbeat_main, NULL) == 0) {
		heartbeat_running = 1;
	} else if (cfg.heartbeat_lease_ns > 0) {
		slurm_error("qrt: %s: cannot start the heartbeat thread; the lease may end "
			    "before the step", key);
		qrt_close(yield_watch);
		yield_watch = NULL;
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

void srun_exit(void)
{
	if (local_reserved) {
		/* The step is over on every node. */
		heartbeat_end();
		release_local("srun exit");
	}
}
