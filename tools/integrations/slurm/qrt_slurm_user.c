/*
 * qrt_slurm_user.c: calls to qrtd as a Slurm job's user (see
 * qrt_slurm_user.h), shared by spank_qrt.so and qrt-slurm-prolog.
 */
#define _GNU_SOURCE
#include "qrt_slurm_user.h"

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
#include <qrt/names.h>

int qrt_slurm_user_of(uid_t uid, gid_t gid, qrt_slurm_user *u, char *why, size_t len)
{
	struct passwd pw;
	struct passwd *found = NULL;
	char buf[16384];
	memset(u, 0, sizeof(*u));
	u->uid = uid;
	const int rc = getpwuid_r(uid, &pw, buf, sizeof(buf), &found);
	if (found == NULL) {
		if (gid != (gid_t)-1) {
			u->gid = gid;
			u->groups[0] = gid;
			u->ngroups = 1;
			return 0;
		}
		snprintf(why, len, "uid %u has no passwd entry (%s)", (unsigned)uid,
			 rc != 0 ? strerror(rc) : "no such user");
		return -1;
	}
	u->gid = gid != (gid_t)-1 ? gid : pw.pw_gid;
	int n = QRT_SLURM_MAX_GROUPS;
	if (getgrouplist(pw.pw_name, u->gid, u->groups, &n) < 0) {
		snprintf(why, len, "user %s is in more than %d groups", pw.pw_name,
			 QRT_SLURM_MAX_GROUPS);
		return -1;
	}
	u->ngroups = n;
	return 0;
}

int qrt_slurm_become(const qrt_slurm_user *u, char *why, size_t len)
{
	/* Never readable nor traceable by the user it becomes: it still holds
	 * its parent's open files. */
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

static int64_t monotonic_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int qrt_slurm_as_user(const qrt_slurm_user *u, int64_t limit_ms, qrt_slurm_work work, void *arg,
		      char *out, size_t out_len, char *why, size_t why_len)
{
	int fds[2];
	out[0] = '\0';
	if (pipe2(fds, O_CLOEXEC) < 0) {
		snprintf(why, why_len, "pipe: %s", strerror(errno));
		return -1;
	}
	const pid_t pid = fork();
	if (pid < 0) {
		snprintf(why, why_len, "fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		/* The child: no logging (the parent's log lock may be another
		 * thread's), one answer up the pipe, _exit.  '0' then the
		 * work's answer, or '1' then why it could not become u. */
		char text[QRT_SLURM_MAX_GANG * 90 + QRT_SLURM_MSG + 16];
		close(fds[0]);
		if (qrt_slurm_become(u, text + 1, sizeof(text) - 1) == 0) {
			text[0] = '0';
			text[1] = '\0';
			work(arg, text + 1, sizeof(text) - 1);
		} else {
			text[0] = '1';
		}
		const size_t n = strnlen(text, sizeof(text) - 1);
		_exit(write(fds[1], text, n) == (ssize_t)n ? 0 : 3);
	}
	close(fds[1]);
	char text[QRT_SLURM_MAX_GANG * 90 + QRT_SLURM_MSG + 16];
	const int64_t t0 = monotonic_ms();
	size_t got = 0;
	int done = 0;
	while (!done && got < sizeof(text) - 1) {
		const int64_t spent = monotonic_ms() - t0;
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
	if (!done) {
		snprintf(why, why_len, "the child acting as uid %u took more than %" PRId64
			 " ms; stopped", (unsigned)u->uid, limit_ms);
		return -1;
	}
	if (got == 0 || (text[0] != '0' && text[0] != '1')) {
		snprintf(why, why_len, "the child acting as uid %u ended without a word (status %d)",
			 (unsigned)u->uid, status);
		return -1;
	}
	if (text[0] == '1') {
		snprintf(why, why_len, "%s", text + 1);
		return -1;
	}
	snprintf(out, out_len, "%s", text + 1);
	return 0;
}

qrt_client *qrt_slurm_connect(const char *url, int timeout_ms, qrt_error *err)
{
	qrt_client *c = NULL;
	const int timeout = timeout_ms < 2000 ? timeout_ms : 2000;
	if (qrt_connect_timeout(url, timeout, &c, err) < 0) {
		return NULL;
	}
	qrt_set_timeout(c, timeout_ms);
	return c;
}

int qrt_slurm_reserve(qrt_client *c, const qrt_slurm_request *req, int64_t not_before_ns,
		      int64_t deadline_ns, const char *key, qrt_slurm_held *h, qrt_error *err)
{
	qrt_slot_request r;
	qrt_reservation got[QRT_SLURM_MAX_GANG];
	memset(&r, 0, sizeof(r));
	r.duration_ns = req->duration_ns;
	r.not_before_ns = not_before_ns;
	r.deadline_ns = deadline_ns;
	r.priority = req->priority;
	r.min_fidelity = req->min_fidelity;
	const int n = qrt_slots_reserve_gang(c, &r, (size_t)req->count, key, req->lease_ns, got,
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
	return 0;
}

int64_t qrt_slurm_earliest_start(qrt_client *c, const qrt_slurm_request *req,
				 int64_t not_before_ns, char *why, size_t why_len)
{
	char params[512];
	char *out = NULL;
	char buf[32];
	int n = snprintf(params, sizeof(params),
			 "{\"duration_ns\":%" PRId64 ",\"not_before_ns\":%" PRId64
			 ",\"priority\":%" PRId32 ",\"max_candidates\":1",
			 req->duration_ns, not_before_ns, req->priority);
	if (req->min_fidelity > 0) {
		n += snprintf(params + n, sizeof(params) - (size_t)n, ",\"min_fidelity\":%.17g",
			      req->min_fidelity);
	}
	if (req->count > 1) {
		n += snprintf(params + n, sizeof(params) - (size_t)n, ",\"gang_size\":%d", req->count);
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

int qrt_slurm_give_back(const char *url, int timeout_ms, const qrt_slurm_held *h, const char *who,
			char *msg, size_t len, int *is_error)
{
	qrt_error err;
	*is_error = 0;
	qrt_client *c = qrt_slurm_connect(url, timeout_ms, &err);
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
	} else if (strcmp(err.reason, QRT_REASON_ILLEGAL_TRANSITION) == 0) {
		if (qrt_jobs_cancel_fenced(c, id, h->fencing_token, &err) == 0) {
			snprintf(msg, len, "qrt: %s: %s: cancelled committed job %" PRIu64, who,
				 h->key, id);
		} else if (strcmp(err.reason, QRT_REASON_ILLEGAL_TRANSITION) == 0) {
			snprintf(msg, len, "qrt: %s: %s: job %" PRIu64 " is already on its way to "
				 "the QPU or over", who, h->key, id);
		} else {
			*is_error = 1;
			snprintf(msg, len, "qrt: %s: %s: jobs.cancel %" PRIu64 ": %s (%s)", who,
				 h->key, id, err.message, err.reason);
			rc = -1;
		}
	} else if (strcmp(err.reason, QRT_REASON_NOT_FOUND) == 0 ||
		   strcmp(err.reason, QRT_REASON_LEASE_EXPIRED) == 0) {
		snprintf(msg, len, "qrt: %s: %s: reservation %" PRIu64 " is already over (%s)", who,
			 h->key, id, err.reason);
	} else if (strcmp(err.reason, QRT_REASON_NOT_OWNER) == 0 ||
		   strcmp(err.reason, QRT_REASON_BAD_FENCING_TOKEN) == 0) {
		/* Not this user's to give back: nothing the caller may do. */
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
