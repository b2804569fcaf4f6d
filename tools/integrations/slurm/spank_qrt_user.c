/*
 * spank_qrt_user.c: the job's user as slurmstepd knows it, and giving a
 * step's slot back as that user (spank_qrt(8), WHO TALKS TO QRTD).
 *
 * slurmstepd and slurmd run the plugin as root, and root is qrtd's admin on
 * most sites: a call made as root may change any tenant's reservation.  So
 * the plugin never calls qrtd as root.  user_init already runs with the
 * job's effective uid (slurmstepd's own seteuid); every other call, at the
 * step's end and in the job epilog, is made by a child process that first
 * becomes the job's user for good and only then connects
 * (qrt_slurm_as_user, qrt_slurm_user.c, which qrt-slurm-prolog shares).
 * What the job's environment says (QRT_NODE_RESERVATIONS) can then make it
 * act on nothing the user could not act on directly.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
	if (n < 0 || n > QRT_SLURM_MAX_GROUPS || (n > 0 && gids == NULL)) {
		snprintf(why, len, "the job's user is in %d groups (at most %d)", n,
			 QRT_SLURM_MAX_GROUPS);
		return -1;
	}
	for (int i = 0; i < n; ++i) {
		u->groups[i] = gids[i];
	}
	u->ngroups = n;
	return 0;
}

int give_back_at(const char *url, const qrt_slurm_held *h, const char *who, char *msg,
		 size_t len, int *is_error)
{
	return qrt_slurm_give_back(url, cfg.timeout_ms, h, who, msg, len, is_error);
}

struct give_back_work {
	const char *url;
	const qrt_slurm_held *h;
	const char *who;
};

/* In the child, as the job's user: "<failed> <is_error> <message>". */
static void give_back_child(void *arg, char *out, size_t len)
{
	const struct give_back_work *w = arg;
	char msg[QRT_SLURM_MSG];
	int is_error = 1;
	const int rc = give_back_at(w->url, w->h, w->who, msg, sizeof(msg), &is_error);
	snprintf(out, len, "%d %d %s", rc == 0 ? 0 : 1, is_error, msg);
}

int give_back_as(const job_user *u, const char *url, const qrt_slurm_held *h, const char *who)
{
	struct give_back_work w = {url, h, who};
	char text[QRT_SLURM_MSG + 16];
	char why[QRT_SLURM_MSG];
	/* Bounded: connecting (at most 2 s) and two calls of timeout= each. */
	const int64_t limit_ms = 4000 + 2 * (int64_t)cfg.timeout_ms;
	if (qrt_slurm_as_user(u, limit_ms, give_back_child, &w, text, sizeof(text), why,
			      sizeof(why)) < 0) {
		slurm_error("qrt: %s: %s: not given back as uid %u: %s (its lease ends it)", who,
			    h->key, (unsigned)u->uid, why);
		return -1;
	}
	int failed = 1;
	int is_error = 1;
	int off = 0;
	if (sscanf(text, "%d %d %n", &failed, &is_error, &off) != 2 || off == 0) {
		slurm_error("qrt: %s: %s: the child giving the slot back as uid %u answered '%.200s'",
			    who, h->key, (unsigned)u->uid, text);
		return -1;
	}
	if (is_error) {
		slurm_error("%s", text + off);
	} else {
		note("%s (as uid %u)", text + off, (unsigned)u->uid);
	}
	return failed ? -1 : 0;
}
