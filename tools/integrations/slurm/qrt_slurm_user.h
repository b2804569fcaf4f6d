/*
 * qrt_slurm_user.h: calls to qrtd for a Slurm job, as the job's user, for
 * spank_qrt.so and qrt-slurm-prolog alike (spank_qrt(8), WHO TALKS TO
 * QRTD).  No Slurm header: the callers say who the job's user is.
 *
 * slurmstepd, slurmd and their Prolog and Epilog run as root, and root is
 * qrtd's admin on most sites: a call made as root may change any tenant's
 * reservation.  So neither program calls qrtd as root: a child process
 * first becomes the job's user for good (setgroups, setresgid, setresuid,
 * then checks it cannot go back) and only then connects.  SO_PEERCRED (or
 * the MUNGE credential, for tcp://) then names that user, and qrtd lets it
 * change its own reservations only, with their fencing tokens.  A child,
 * not a seteuid in the caller: the caller's other threads keep root
 * meanwhile, and the child cannot regain it.
 *
 * Conventions as qrt_slurm.h (0 or a negative errno unless said); nothing
 * here logs: the caller says what happened, where its context allows.
 */
#ifndef QRT_SLURM_USER_H
#define QRT_SLURM_USER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <qrt/client.h>

#include "qrt_slurm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most supplementary groups of a job's user carried. */
#define QRT_SLURM_MAX_GROUPS 1024

typedef struct qrt_slurm_user {
	uid_t uid;
	gid_t gid;
	int ngroups;
	gid_t groups[QRT_SLURM_MAX_GROUPS];
} qrt_slurm_user;

/* uid with gid (or, gid (gid_t)-1, its passwd entry's) and the groups its
 * passwd and group entries give it.  A uid without a passwd entry keeps
 * gid alone, when gid is given.  0, or -1 with why. */
int qrt_slurm_user_of(uid_t uid, gid_t gid, qrt_slurm_user *u, char *why, size_t len);

/* Become u for good (groups, gid, uid), in a child of root: never dumpable,
 * and unable to become root again (checked).  0, or -1 with why. */
int qrt_slurm_become(const qrt_slurm_user *u, char *why, size_t len);

/* work(arg, out, out_len) in a child that became u first; it writes what it
 * answers as text into out.  Bounded: a child that has not answered after
 * limit_ms is killed.  0 with the child's answer in out, or -1 with why
 * (no child, it could not become u, it took too long, it died without a
 * word). */
typedef void (*qrt_slurm_work)(void *arg, char *out, size_t out_len);
int qrt_slurm_as_user(const qrt_slurm_user *u, int64_t limit_ms, qrt_slurm_work work, void *arg,
		      char *out, size_t out_len, char *why, size_t why_len);

/* qrt_connect_timeout to url (at most 2 s, less when timeout_ms is), then
 * each call at most timeout_ms; NULL with *err. */
qrt_client *qrt_slurm_connect(const char *url, int timeout_ms, qrt_error *err);

/* slots.reserve of req (its duration, priority, fidelity, count and lease)
 * between not_before_ns and deadline_ns under key: 0 and *h (its key is
 * key), or -1 and *err. */
int qrt_slurm_reserve(qrt_client *c, const qrt_slurm_request *req, int64_t not_before_ns,
		      int64_t deadline_ns, const char *key, qrt_slurm_held *h, qrt_error *err);

/* The earliest start qrtd could give req at or after not_before_ns,
 * ignoring the deadline (for the message of a request that did not fit),
 * or 0 (why, when given, says why). */
int64_t qrt_slurm_earliest_start(qrt_client *c, const qrt_slurm_request *req,
				 int64_t not_before_ns, char *why, size_t why_len);

/* Give h back at url: release a held reservation, cancel a committed job
 * (with h's fencing token); one that was dispatched, has ended, or is not
 * the caller's needs nothing.  0 when qrtd has it in a final state, -1
 * when qrtd could not be told (try again later); msg says what happened
 * ("qrt: WHO: KEY: ..."), *is_error whether that is worth an error. */
int qrt_slurm_give_back(const char *url, int timeout_ms, const qrt_slurm_held *h, const char *who,
			char *msg, size_t len, int *is_error);

#ifdef __cplusplus
}
#endif

#endif /* QRT_SLURM_USER_H */
