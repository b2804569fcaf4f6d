/*
 * spank_qrt_user.c: the job's user, and giving a step's slot back as that
 * user (spank_qrt(8), WHO TALKS TO QRTD).
 *
 * slurmstepd and slurmd run the plugin as root, and root is qrtd's admin on
 * most sites: a call made as root may change any tenant's reservation.  So
 * the plugin never calls qrtd as root.  user_init already runs with the
 * job's effective uid (slurmstepd's own seteuid); every other call, at the
 * step's end and in the job epilog, is made by a child process that first
 * becomes the job's user for good (setgroups, setresgid, setresuid, then
 * checks it cannot go back) and only then connects.  SO_PEERCRED (or the
 * MUNGE credential, for tcp://) then names that user, and qrtd lets it
 * change its own reservations only, with their fencing tokens: what the
 * job's environment says (QRT_NODE_RESERVATIONS) can make it act on nothing
 * the user could not act on directly.  A child, not a seteuid in
 * slurmstepd: slurmstepd's other threads keep root meanwhile, and the child
 * cannot regain it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spank_qrt.h"

int job_user_of_step(spank_t sp, job_user *u, char *why, size_t len)
{
	gid_t *gids = NULL;
	int n = 0;
	memset(u, 0, sizeof(*u));
	spank_err_t rc = spank_get_item(sp, S_JOB_UID, &u->uid);
	if (rc == ESPANK_SUCCESS) {
		rc = spank_get_item(sp, S_JOB_GID, &u->gid);
	}
	if (rc == ESPANK_SUCCESS) {
		rc = spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &n);
	}
	if (rc != ESPANK_SUCCESS) {
		snprintf(why, len, "the step's uid, gid and groups: %s", spank_strerror(rc));
		return -1;
	}
	if (n < 0 || n > QRT_JOB_MAX_GROUPS || (n > 0 && gids == NULL)) {
		snprintf(why, len, "the job's user is in %d groups (at most %d)", n,
			 QRT_JOB_MAX_GROUPS);
		return -1;
	}
	for (int i = 0; i < n; ++i) {
		u->groups[i] = gids[i];
	}
	u->ngroups = n;
	return 0;
}

int job_user_of_uid(uid_t uid, job_user *u, char *why, size_t len)
{
	struct passwd pw;
	struct passwd *found = NULL;
	char buf[16384];
	memset(u, 0, sizeof(*u));
	const int rc = getpwuid_r(uid, &pw, buf, sizeof(buf), &found);
	if (found == NULL) {
		snprintf(why, len, "uid %u has no passwd entry (%s)", (unsigned)uid,
			 rc != 0 ? strerror(rc) : "no such user");
		return -1;
	}
	u->uid = uid;
	u->gid = pw.pw_gid;
	int n = QRT_JOB_MAX_GROUPS;
	if (getgrouplist(pw.pw_name, pw.pw_gid, u->groups, &n) < 0) {
		snprintf(why, len, "user %s is in more than %d groups", pw.pw_name,
			 QRT_JOB_MAX_GROUPS);
		return -1;
	}
	u->ngroups = n;
	return 0;
}

int give_back_at(const char *url, const qrt_slurm_held *h, const char *who, char *msg,
		 size_t len, int *is_error)
{
	qrt_error err;
	*is_error = 0;
	qrt_client *c = connect_to(url, &err);
	if (c == NULL) {
		*is_error = 1;
		snprintf(msg, len, "qrt: %s: %s: cannot reach qrtd at %s to give back %s: %s", who,
			 h->key, url, h->key, err.message);
		return -1;
	}
	int rc = 0;
	const uint64_t id = h->member[0].id; /* a gang acts as one */
	if (qrt_slots_release(c, id, h->fencing_token, &err) == 0) {
		snprintf(msg, len, "qrt: %s: %s: released reservation %" PRIu64, who, h->key, id);
	} else if (strcmp(err.reason, "illegal_transition") == 0) {
		if (qrt_jobs_cancel_fenced(c, id, h->fencing_token, &err) == 0) {
			snprintf(msg, len, "qrt: %s: %s: cancelled committed job %" PRIu64, who,
				 h->key, id);
		} else if (strcmp(err.reason, "illegal_transition") == 0) {
			snprintf(msg, len, "qrt: %s: %s: job %" PRIu64 " is already on its way to "
				 "the QPU or over", who, h->key, id);
		} else {
			*is_error = 1;
			snprintf(msg, len, "qrt: %s: %s: jobs.cancel %" PRIu64 ": %s (%s)", who,
				 h->key, id, err.message, err.reason);
			rc = -1;
		}
	} else if (strcmp(err.reason, "not_found") == 0 ||
		   strcmp(err.reason, "lease_expired") == 0) {
		snprintf(msg, len, "qrt: %s: %s: reservation %" PRIu64 " is already over (%s)", who,
			 h->key, id, err.reason);
	} else if (strcmp(err.reason, "not_owner") == 0 ||
		   strcmp(err.reason, "bad_fencing_token") == 0) {
		/* Not this user's to give back: nothing the plugin may do. */
		*is_error = 1;
		snprintf(msg, len, "qrt: %s: %s: reservation %" PRIu64 " was not given back: %s "
			 "(%s)", who, h->key, id, err.message, err.reason);
	} else {
		*is_error = 1;
		snprintf(msg, len, "qrt: %s: %s: slots.release %" PRIu64 ": %s (%s)", who, h->key,
			 id, err.message, err.reason);
		rc = -1;
	}
	qrt_close(c);
	return rc;
}

/* In the child: become u for good.  0, or -1 with why. */
static int become(const job_user *u, char *why, size_t len)
{
	/* Never readable nor traceable by the user it becomes: it still holds
	 * slurmstepd's open files. */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (setgroups((size_t)u->ngroups, u->groups) < 0 || setresgid(u->gid, u->gid, u->gid) < 0 ||
	    setresuid(u->uid, u->uid, u->uid) < 0) {
		snprintf(why, len, "cannot become uid %u gid %u: %s", (unsigned)u->uid,
			 (unsigned)u->gid, strerror(errno));
		return -1;
	}
	if (u->uid != 0 && (setresuid(0, 0, 0) == 0 || geteuid() == 0)) {
		snprintf(why, len, "uid %u could become root again", (unsigned)u->uid);
		return -1;
	}
	return 0;
}

int give_back_as(const job_user *u, const char *url, const qrt_slurm_held *h, const char *who)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0) {
		slurm_error("qrt: %s: %s: pipe: %s; not given back (its lease ends it)", who, h->key,
			    strerror(errno));
		return -1;
	}
	const pid_t pid = fork();
	if (pid < 0) {
		slurm_error("qrt: %s: %s: fork: %s; not given back (its lease ends it)", who, h->key,
			    strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		/* The child: no logging (Slurm's log lock may be another
		 * thread's), one message up the pipe, _exit. */
		char out[QRT_SLURM_MSG + 16];
		char msg[QRT_SLURM_MSG];
		int is_error = 1;
		int rc = -1;
		close(fds[0]);
		if (become(u, msg, sizeof(msg)) == 0) {
			rc = give_back_at(url, h, who, msg, sizeof(msg), &is_error);
		}
		const int n = snprintf(out, sizeof(out), "%d %d %s", rc == 0 ? 0 : 1, is_error, msg);
		if (n > 0 && write(fds[1], out, (size_t)n < sizeof(out) ? (size_t)n : sizeof(out) - 1) < 0) {
			_exit(3);
		}
		_exit(0);
	}
	close(fds[1]);
	/* Bounded: connecting (at most 2 s) and two calls of timeout= each. */
	const int64_t limit_ms = 4000 + 2 * (int64_t)cfg.timeout_ms;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char text[QRT_SLURM_MSG + 16];
	size_t got = 0;
	int done = 0;
	while (!done && got < sizeof(text) - 1) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		const int64_t spent = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
				      (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (spent >= limit_ms) {
			break;
		}
		struct pollfd p = {.fd = fds[0], .events = POLLIN};
		const int r = poll(&p, 1, (int)(limit_ms - spent));
		if (r < 0 && errno == EINTR) {
			continue;
		}
		if (r <= 0) {
			break;
		}
		const ssize_t n = read(fds[0], text + got, sizeof(text) - 1 - got);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0) {
			done = 1;
		} else {
			got += (size_t)n;
		}
	}
	close(fds[0]);
	text[got] = '\0';
	if (!done) {
		kill(pid, SIGKILL);
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	int failed = 1;
	int is_error = 1;
	int off = 0;
	if (!done) {
		slurm_error("qrt: %s: %s: giving the slot back as uid %u took more than %" PRId64
			    " ms; stopped (its lease ends it)", who, h->key, (unsigned)u->uid,
			    limit_ms);
	} else if (sscanf(text, "%d %d %n", &failed, &is_error, &off) != 2 || off == 0) {
		failed = 1;
		slurm_error("qrt: %s: %s: the child giving the slot back as uid %u ended without a "
			    "word (status %d)", who, h->key, (unsigned)u->uid, status);
	} else if (is_error) {
		slurm_error("%s", text + off);
	} else {
		note("%s (as uid %u)", text + off, (unsigned)u->uid);
	}
	return failed ? -1 : 0;
}
