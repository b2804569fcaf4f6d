/*
 * qrt_slurm_impl.h: what qrt_slurm.c and qrt_slurm_job.c share inside the
 * core (not part of its interface, qrt_slurm.h).  Same conventions: 0 or a
 * negative errno.
 */
#ifndef QRT_SLURM_IMPL_H
#define QRT_SLURM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "qrt_slurm.h"

#pragma GCC visibility push(hidden)

/* vsnprintf into msg (when given); returns rc. */
int qrt_slurm_say(char *msg, size_t len, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* snprintf into buf; -ENOSPC when it did not fit. */
int qrt_slurm_put(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* src into dst of cap bytes; -ENOSPC when it does not fit. */
int qrt_slurm_copy(char *dst, size_t cap, const char *src);
/* Strict unsigned decimal of n bytes: digits only, no sign, no spaces, no
 * overflow. */
int qrt_slurm_parse_u64(const char *s, size_t n, uint64_t *out);
/* One --qpu-* option (name without the dashes) that the user's messages
 * call label ("--qpu-duration", or a comment's "duration"). */
int qrt_slurm_option_as(qrt_slurm_options *o, const char *name, const char *label,
			const char *value, char *msg, size_t msg_len);
/* Whether v may be a state file's value: no control character (a newline
 * would start a line of its own) and none of also. */
int qrt_slurm_field_ok(const char *v, const char *also);
/* The lines of a held reservation in a state file (key, ids, qpus,
 * fencing_token, start_ns, end_ns, lease_expires_ns), without a header. */
int qrt_slurm_held_lines(const qrt_slurm_held *h, char *buf, size_t len);

#pragma GCC visibility pop

#endif /* QRT_SLURM_IMPL_H */
