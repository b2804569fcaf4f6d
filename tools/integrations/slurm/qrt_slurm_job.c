/*
 * qrt_slurm_job.c: the part of the core only qrt-slurm-prolog asks (see
 * qrt_slurm.h): a job comment's qpu: request, read through the same option
 * parser as --qpu-*; the record the prolog keeps per job; the times of
 * `scontrol show job`.
 */
#define _GNU_SOURCE
#include "qrt_slurm.h"
#include "qrt_slurm_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The keys of a comment's request and the --qpu-* option each one is. */
static const struct {
	const char *key;
	const char *option;
} comment_keys[] = {
	{"duration", "qpu-duration"},         {"count", "qpu-count"},
	{"deadline", "qpu-deadline"},         {"not-before", "qpu-not-before"},
	{"min-fidelity", "qpu-min-fidelity"}, {"priority", "qpu-priority"},
};

/* The first "qpu:" word of text (at its start or after a blank, followed
 * by a non-blank), or NULL. */
static const char *qpu_word(const char *text)
{
	for (const char *p = text; *p != '\0'; ++p) {
		if ((p == text || isspace((unsigned char)p[-1])) && strncmp(p, "qpu:", 4) == 0 &&
		    p[4] != '\0' && !isspace((unsigned char)p[4])) {
			return p + 4;
		}
	}
	return NULL;
}

int qrt_slurm_comment_options(const char *comment, qrt_slurm_options *o, char *msg, size_t msg_len)
{
	qrt_slurm_options_default(o);
	o->from_comment = 1;
	const char *p = comment != NULL ? qpu_word(comment) : NULL;
	if (p == NULL) {
		return 0;
	}
	for (;;) {
		size_t n = 0;
		while (p[n] != '\0' && p[n] != ',' && !isspace((unsigned char)p[n])) {
			++n;
		}
		char item[256];
		if (n >= sizeof(item)) {
			return qrt_slurm_say(msg, msg_len, -EINVAL, "'%.40s...' is longer than %zu bytes", p,
					     sizeof(item) - 1);
		}
		memcpy(item, p, n);
		item[n] = '\0';
		char *eq = strchr(item, '=');
		if (eq == NULL || eq[1] == '\0') {
			return qrt_slurm_say(msg, msg_len, -EINVAL, "'%s' is not key=value", item);
		}
		*eq = '\0';
		size_t k = 0;
		while (k < sizeof(comment_keys) / sizeof(comment_keys[0]) &&
		       strcmp(item, comment_keys[k].key) != 0) {
			++k;
		}
		if (k == sizeof(comment_keys) / sizeof(comment_keys[0])) {
			return qrt_slurm_say(msg, msg_len, -EINVAL,
					     "unknown key '%s' (duration, count, deadline, not-before, "
					     "min-fidelity, priority)",
					     item);
		}
		const int rc = qrt_slurm_option_as(o, comment_keys[k].option, comment_keys[k].key,
						   eq + 1, msg, msg_len);
		if (rc < 0) {
			return rc;
		}
		if (p[n] != ',') {
			break;
		}
		p += n + 1;
	}
	if (o->duration_ns <= 0) {
		return qrt_slurm_say(msg, msg_len, -EINVAL, "duration is required (qpu:duration=2ms)");
	}
	return 1;
}

int qrt_slurm_scontrol_time(const char *text, const char *field, struct tm *out)
{
	const size_t flen = strlen(field);
	for (const char *p = strstr(text, field); p != NULL; p = strstr(p + 1, field)) {
		if ((p != text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) || p[flen] != '=') {
			continue;
		}
		int n = 0;
		memset(out, 0, sizeof(*out));
		if (sscanf(p + flen + 1, "%4d-%2d-%2dT%2d:%2d:%2d%n", &out->tm_year, &out->tm_mon,
			   &out->tm_mday, &out->tm_hour, &out->tm_min, &out->tm_sec, &n) != 6 ||
		    n != 19 || (p[flen + 20] != '\0' && !isspace((unsigned char)p[flen + 20]))) {
			return -ENOENT;
		}
		out->tm_year -= 1900;
		out->tm_mon -= 1;
		out->tm_isdst = -1;
		return 0;
	}
	return -ENOENT;
}

/* ------------------------------------------------------------ the job record */

static const char record_header[] =
	"# qrt-slurm-prolog: a job's reservation (or why it has none), for its TaskProlog and "
	"Epilog\n";

int qrt_slurm_job_record_format(const qrt_slurm_job_record *r, char *buf, size_t len)
{
	size_t at = 0;
	int rc = qrt_slurm_put(buf, len, "%s", record_header);
	if (rc == 0) {
		at = strlen(buf);
	}
	if (rc == 0 && r->held.n > 0) {
		rc = qrt_slurm_field_ok(r->socket, "") && r->socket[0] != '\0'
			     ? qrt_slurm_put(buf + at, len - at, "socket=%s\n", r->socket)
			     : -EINVAL;
		if (rc == 0) {
			at += strlen(buf + at);
			rc = qrt_slurm_held_lines(&r->held, buf + at, len - at);
		}
	} else if (rc == 0) {
		/* The reason is one of qrtd's or the client's: a word.  The
		 * error may quote what qrtd or the comment said: one line. */
		char error[sizeof(r->error)];
		size_t n = 0;
		for (; r->error[n] != '\0' && n + 1 < sizeof(error); ++n) {
			const unsigned char c = (unsigned char)r->error[n];
			error[n] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
		}
		error[n] = '\0';
		int word = r->reason[0] != '\0';
		for (const char *c = r->reason; *c != '\0'; ++c) {
			word = word && ((*c >= 'a' && *c <= 'z') || *c == '_');
		}
		rc = word && qrt_slurm_field_ok(r->held.key, "")
			     ? qrt_slurm_put(buf + at, len - at, "key=%s\nreason=%s\nerror=%s\n",
					     r->held.key, r->reason, error)
			     : -EINVAL;
	}
	if (rc < 0 && len > 0) {
		buf[0] = '\0';
	}
	return rc;
}

int qrt_slurm_job_record_parse(const char *text, qrt_slurm_job_record *out)
{
	memset(out, 0, sizeof(*out));
	/* socket, reason and error are this record's; the rest is a held
	 * reservation's lines, which qrt_slurm_state_parse reads. */
	char rest[QRT_SLURM_MAX_GANG * 90 + 512];
	size_t at = 0;
	int seen = 0;
	int keys = 0;
	const char *p = text;
	while (*p != '\0') {
		const char *nl = strchr(p, '\n');
		const size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
		const char *line = p;
		p += n + (nl != NULL ? 1 : 0);
		static const char *const own[] = {"socket=", "reason=", "error="};
		char *const dst[] = {out->socket, out->reason, out->error};
		const size_t cap[] = {sizeof(out->socket), sizeof(out->reason), sizeof(out->error)};
		int f = 0;
		while (f < 3 && strncmp(line, own[f], strlen(own[f])) != 0) {
			++f;
		}
		if (f < 3) {
			const size_t k = strlen(own[f]);
			if ((seen & (1 << f)) || n - k >= cap[f]) {
				return -EINVAL;
			}
			seen |= 1 << f;
			memcpy(dst[f], line + k, n - k);
			dst[f][n - k] = '\0';
			continue;
		}
		if (strncmp(line, "key=", 4) == 0) {
			++keys;
			if (keys == 1 && n - 4 < sizeof(out->held.key)) {
				memcpy(out->held.key, line + 4, n - 4);
				out->held.key[n - 4] = '\0';
			}
		}
		if (at + n + 1 >= sizeof(rest)) {
			return -EINVAL;
		}
		memcpy(rest + at, line, n);
		at += n;
		rest[at++] = '\n';
	}
	rest[at] = '\0';
	if (seen == 6) {
		/* No reservation: reason and error, the key once, nothing else. */
		for (const char *l = rest; *l != '\0'; l = strchr(l, '\n') + 1) {
			if (l[0] != '#' && l[0] != '\n' && strncmp(l, "key=", 4) != 0) {
				return -EINVAL;
			}
		}
		return keys == 1 && out->reason[0] != '\0' ? 0 : -EINVAL;
	}
	if (seen != 1 || out->socket[0] == '\0') {
		return -EINVAL;
	}
	return qrt_slurm_state_parse(rest, &out->held) < 0 ? -EINVAL : 0;
}
