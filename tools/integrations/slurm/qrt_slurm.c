/*
 * qrt_slurm.c: the Slurm-independent half of spank_qrt.so and
 * qrt-slurm-prolog (see qrt_slurm.h): options, requests, keys, CPU lists,
 * a step's state file and the messages.  qrt_slurm_job.c holds what only
 * the prolog asks (a job comment's request, its job record, scontrol's
 * times).
 */
#define _GNU_SOURCE
#include "qrt_slurm.h"
#include "qrt_slurm_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <qrt/names.h>

#define NS_PER_S INT64_C(1000000000)
#define MAX_DURATION_NS (INT64_C(366) * 24 * 3600 * NS_PER_S)

int qrt_slurm_say(char *msg, size_t len, int rc, const char *fmt, ...)
{
	if (msg != NULL && len > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, len, fmt, ap);
		va_end(ap);
	}
	return rc;
}

int qrt_slurm_put(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	const int n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len) {
		return -ENOSPC;
	}
	return 0;
}

int qrt_slurm_copy(char *dst, size_t cap, const char *src)
{
	const size_t n = strlen(src);
	if (n >= cap) {
		return -ENOSPC;
	}
	memcpy(dst, src, n + 1);
	return 0;
}

#define say qrt_slurm_say
#define put qrt_slurm_put
#define copy qrt_slurm_copy
#define parse_u64 qrt_slurm_parse_u64

void qrt_slurm_config_default(qrt_slurm_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	copy(cfg->socket, sizeof(cfg->socket), "/run/qrtd/qrtd.sock");
	copy(cfg->state_dir, sizeof(cfg->state_dir), "/run/qrtd-slurm");
	cfg->setup_margin_ns = 2 * NS_PER_S;
	cfg->max_lease_ns = 3600 * NS_PER_S;
	cfg->submit_lead_ns = 300 * 1000000;
	cfg->timeout_ms = 5000;
	cfg->cpuset_check = 1;
}

void qrt_slurm_options_default(qrt_slurm_options *o)
{
	memset(o, 0, sizeof(*o));
	o->count = 1;
}

int qrt_slurm_parse_u64(const char *s, size_t n, uint64_t *out)
{
	if (n == 0) {
		return -EINVAL;
	}
	uint64_t v = 0;
	for (size_t i = 0; i < n; ++i) {
		if (s[i] < '0' || s[i] > '9') {
			return -EINVAL;
		}
		const uint64_t d = (uint64_t)(s[i] - '0');
		if (v > (UINT64_MAX - d) / 10) {
			return -ERANGE;
		}
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

int qrt_slurm_parse_duration(const char *text, int64_t *out_ns, char *msg, size_t msg_len)
{
	static const struct {
		const char *unit;
		int64_t ns;
	} units[] = {
		{"ns", 1}, {"us", 1000}, {"ms", 1000000}, {"s", NS_PER_S},
		{"m", 60 * NS_PER_S}, {"h", 3600 * NS_PER_S}, {"", 1},
	};
	if (text == NULL || text[0] == '\0') {
		return say(msg, msg_len, -EINVAL, "a duration is required (e.g. 2ms, 500us, 1s)");
	}
	size_t digits = 0;
	while (text[digits] >= '0' && text[digits] <= '9') {
		++digits;
	}
	const char *unit = text + digits;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); ++i) {
		if (strcmp(unit, units[i].unit) != 0) {
			continue;
		}
		uint64_t v = 0;
		if (parse_u64(text, digits, &v) < 0 || v == 0 ||
		    v > (uint64_t)(MAX_DURATION_NS / units[i].ns)) {
			break;
		}
		*out_ns = (int64_t)v * units[i].ns;
		return 0;
	}
	return say(msg, msg_len, -EINVAL,
		   "'%s' is not a duration: expected a positive integer with a unit ns, us, ms, "
		   "s, m or h (e.g. 2ms), at most 366 days",
		   text);
}

int qrt_slurm_parse_time(const char *text, int *relative, int64_t *out_ns, char *msg,
			 size_t msg_len)
{
	if (text != NULL && text[0] == '+') {
		char inner[QRT_SLURM_MSG];
		if (qrt_slurm_parse_duration(text + 1, out_ns, inner, sizeof(inner)) < 0) {
			return say(msg, msg_len, -EINVAL, "'%s': %s", text, inner);
		}
		*relative = 1;
		return 0;
	}
	if (text != NULL && text[0] == '@') {
		const char *s = text + 1;
		const char *dot = strchr(s, '.');
		const size_t int_len = dot != NULL ? (size_t)(dot - s) : strlen(s);
		uint64_t secs = 0;
		int64_t frac_ns = 0;
		int ok = parse_u64(s, int_len, &secs) == 0 && secs < (uint64_t)(INT64_MAX / NS_PER_S / 2);
		if (ok && dot != NULL) {
			const char *f = dot + 1;
			const size_t flen = strlen(f);
			uint64_t fv = 0;
			ok = flen >= 1 && flen <= 9 && parse_u64(f, flen, &fv) == 0;
			for (size_t i = flen; ok && i < 9; ++i) {
				fv *= 10;
			}
			frac_ns = (int64_t)fv;
		}
		if (ok) {
			*relative = 0;
			*out_ns = (int64_t)secs * NS_PER_S + frac_ns;
			return 0;
		}
	}
	return say(msg, msg_len, -EINVAL,
		   "'%s' is not a time: expected +DURATION (from the step's or job's start, e.g. +30s) or "
		   "@UNIX_SECONDS (e.g. @1767225600.5)",
		   text != NULL ? text : "");
}

int qrt_slurm_option(qrt_slurm_options *o, const char *name, const char *value, char *msg,
		     size_t msg_len)
{
	char label[64];
	snprintf(label, sizeof(label), "--%s", name);
	return qrt_slurm_option_as(o, name, label, value, msg, msg_len);
}

int qrt_slurm_option_as(qrt_slurm_options *o, const char *name, const char *label,
			const char *value, char *msg, size_t msg_len)
{
	char inner[QRT_SLURM_MSG];
	if (value == NULL) {
		return say(msg, msg_len, -EINVAL, "%s needs a value", label);
	}
	if (strcmp(name, "qpu-duration") == 0) {
		if (qrt_slurm_parse_duration(value, &o->duration_ns, inner, sizeof(inner)) < 0) {
			return say(msg, msg_len, -EINVAL, "%s: %s", label, inner);
		}
		return 0;
	}
	if (strcmp(name, "qpu-deadline") == 0 || strcmp(name, "qpu-not-before") == 0) {
		const int is_deadline = name[4] == 'd';
		int rel = 0;
		int64_t t = 0;
		if (qrt_slurm_parse_time(value, &rel, &t, inner, sizeof(inner)) < 0) {
			return say(msg, msg_len, -EINVAL, "%s: %s", label, inner);
		}
		if (is_deadline) {
			o->deadline_set = 1;
			o->deadline_relative = rel;
			o->deadline_ns = t;
		} else {
			o->not_before_set = 1;
			o->not_before_relative = rel;
			o->not_before_ns = t;
		}
		return 0;
	}
	if (strcmp(name, "qpu-min-fidelity") == 0) {
		char *end = NULL;
		errno = 0;
		const double f = strtod(value, &end);
		if (errno != 0 || end == value || *end != '\0' || !(f > 0.0 && f <= 1.0)) {
			return say(msg, msg_len, -EINVAL,
				   "%s: '%s' is not a number in (0, 1]", label, value);
		}
		o->min_fidelity = f;
		return 0;
	}
	if (strcmp(name, "qpu-priority") == 0) {
		const char *s = value;
		const int neg = *s == '-';
		uint64_t v = 0;
		if (neg) {
			++s;
		}
		if (parse_u64(s, strlen(s), &v) < 0 || v > (uint64_t)INT32_MAX + (neg ? 1u : 0u)) {
			return say(msg, msg_len, -EINVAL,
				   "%s: '%s' is not an integer in [%d, %d]", label, value,
				   INT32_MIN, INT32_MAX);
		}
		o->priority_set = 1;
		o->priority = neg ? (int32_t)(-(int64_t)v) : (int32_t)v;
		return 0;
	}
	if (strcmp(name, "qpu-count") == 0) {
		uint64_t v = 0;
		if (parse_u64(value, strlen(value), &v) < 0 || v < 1 || v > QRT_SLURM_MAX_GANG) {
			return say(msg, msg_len, -EINVAL,
				   "%s: '%s' is not an integer in [1, %d]", label, value,
				   QRT_SLURM_MAX_GANG);
		}
		o->count = (int)v;
		return 0;
	}
	return say(msg, msg_len, -EINVAL, "unknown option %s", label);
}

int qrt_slurm_node_url(const qrt_slurm_config *cfg, const char *node, char *buf, size_t len)
{
	size_t at = 0;
	for (const char *p = cfg->node_url; *p != '\0'; ++p) {
		const char *piece = p;
		size_t n = 1;
		if (p[0] == '%' && p[1] == 'n') {
			piece = node;
			n = strlen(node);
			++p;
		}
		if (at + n >= len) {
			return -ENOSPC;
		}
		memcpy(buf + at, piece, n);
		at += n;
	}
	if (len == 0) {
		return -ENOSPC;
	}
	buf[at] = '\0';
	return 0;
}

int qrt_slurm_node_entry_format(const char *node, const qrt_slurm_held *h, char *buf, size_t len)
{
	char ids[QRT_SLURM_MAX_GANG * 21];
	char qpus[QRT_SLURM_MAX_GANG * 65];
	if (strpbrk(node, "|;") != NULL || qrt_slurm_ids_text(h, ids, sizeof(ids)) < 0 ||
	    qrt_slurm_qpus_text(h, qpus, sizeof(qpus)) < 0) {
		return -EINVAL;
	}
	return put(buf, len, "%s|%s|%" PRIu64 "|%s", node, ids, h->fencing_token, qpus);
}

int qrt_slurm_node_entry_parse(const char *text, int index, char *node, size_t node_len,
			       qrt_slurm_held *out)
{
	const char *p = text;
	for (int i = 0; i < index; ++i) {
		p = strchr(p, ';');
		if (p == NULL) {
			return -ENOENT;
		}
		++p;
	}
	const char *end = strchr(p, ';');
	const size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
	char entry[QRT_SLURM_MAX_GANG * 90 + 128];
	if (n == 0 || n >= sizeof(entry)) {
		return -EINVAL;
	}
	memcpy(entry, p, n);
	entry[n] = '\0';
	char *field[4];
	char *save = NULL;
	int k = 0;
	for (char *t = strtok_r(entry, "|", &save); t != NULL && k < 4; t = strtok_r(NULL, "|", &save)) {
		field[k++] = t;
	}
	if (k != 4 || copy(node, node_len, field[0]) < 0) {
		return -EINVAL;
	}
	memset(out, 0, sizeof(*out));
	uint64_t token = 0;
	if (parse_u64(field[2], strlen(field[2]), &token) < 0) {
		return -EINVAL;
	}
	out->fencing_token = token;
	save = NULL;
	for (char *t = strtok_r(field[1], ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
		uint64_t id = 0;
		if (out->n >= QRT_SLURM_MAX_GANG || parse_u64(t, strlen(t), &id) < 0 || id == 0) {
			return -EINVAL;
		}
		out->member[out->n++].id = id;
	}
	int i = 0;
	save = NULL;
	for (char *t = strtok_r(field[3], ",", &save); t != NULL && i < out->n;
	     t = strtok_r(NULL, ",", &save), ++i) {
		copy(out->member[i].qpu, sizeof(out->member[i].qpu), t);
	}
	return out->n > 0 ? 0 : -EINVAL;
}

int qrt_slurm_checks_cpuset(const qrt_slurm_config *cfg)
{
	return cfg->cpuset_check && strncmp(cfg->socket, "tcp://", 6) != 0;
}

int qrt_slurm_config_arg(qrt_slurm_config *cfg, const char *arg, char *msg, size_t msg_len)
{
	const char *eq = strchr(arg, '=');
	if (eq == NULL || eq == arg) {
		return say(msg, msg_len, -EINVAL,
			   "plugstack.conf argument '%s' is not key=value (keys: socket, state_dir, "
			   "cluster, setup_margin, max_lease, submit_lead, timeout, cpuset_check, qrtd_node, "
			   "qrtd_nodes, lease)",
			   arg);
	}
	const size_t klen = (size_t)(eq - arg);
	const char *v = eq + 1;
	char inner[QRT_SLURM_MSG];
#define KEY(k) (klen == strlen(k) && strncmp(arg, k, klen) == 0)
	if (KEY("socket") || KEY("state_dir")) {
		char *dst = KEY("socket") ? cfg->socket : cfg->state_dir;
		const size_t cap = KEY("socket") ? sizeof(cfg->socket) : sizeof(cfg->state_dir);
		/* socket= may name a qrtd on another node: tcp://HOST:PORT
		 * (libqrt-client authenticates with MUNGE as the job's user). */
		const int tcp = KEY("socket") && strncmp(v, "tcp://", 6) == 0;
		if (tcp && (strchr(v + 6, ':') == NULL || v[6] == '\0' || v[6] == ':')) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf socket='%s': tcp://HOST:PORT "
				   "is required (or an absolute path)", v);
		}
		if (v[0] != '/' && !tcp) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf %.*s='%s': an absolute path "
				   "%sis required", (int)klen, arg, v,
				   KEY("socket") ? "or tcp://HOST:PORT " : "");
		}
		if (copy(dst, cap, v) < 0) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf %.*s: path longer than %zu "
				   "bytes", (int)klen, arg, cap - 1);
		}
		return 0;
	}
	if (KEY("qrtd_node")) {
		const char *colon = strrchr(v, ':');
		if (strncmp(v, "tcp://", 6) != 0 || strstr(v, "%n") == NULL || colon == NULL ||
		    colon < v + 6) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf qrtd_node='%s': "
				   "tcp://HOST:PORT with %%n for the node's name is required "
				   "(e.g. tcp://%%n:7071)", v);
		}
		if (copy(cfg->node_url, sizeof(cfg->node_url), v) < 0) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf qrtd_node: longer than %zu "
				   "bytes", sizeof(cfg->node_url) - 1);
		}
		return 0;
	}
	if (KEY("qrtd_nodes")) {
		if (v[0] == '\0' || strpbrk(v, " \t") != NULL ||
		    copy(cfg->node_list, sizeof(cfg->node_list), v) < 0) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf qrtd_nodes='%s': a Slurm "
				   "host list (e.g. qpu[1-4]) of 1 to %zu characters", v,
				   sizeof(cfg->node_list) - 1);
		}
		return 0;
	}
	if (KEY("cluster")) {
		if (!qrt_slurm_cluster_ok(v) || copy(cfg->cluster, sizeof(cfg->cluster), v) < 0) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf cluster='%s': 1 to %zu "
				   "letters, digits, '.', '_' or '-'", v, sizeof(cfg->cluster) - 1);
		}
		return 0;
	}
	if (KEY("lease")) {
		int64_t ns = 0;
		if (qrt_slurm_parse_duration(v, &ns, inner, sizeof(inner)) < 0) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf lease: %s", inner);
		}
		if (ns < 3 * NS_PER_S) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf lease='%s': at least 3s "
				   "(srun renews it every third)", v);
		}
		cfg->heartbeat_lease_ns = ns;
		return 0;
	}
	if (KEY("setup_margin") || KEY("max_lease") || KEY("timeout") || KEY("submit_lead")) {
		int64_t ns = 0;
		if (qrt_slurm_parse_duration(v, &ns, inner, sizeof(inner)) < 0) {
			return say(msg, msg_len, -EINVAL, "plugstack.conf %.*s: %s", (int)klen, arg,
				   inner);
		}
		if (KEY("setup_margin")) {
			cfg->setup_margin_ns = ns;
		} else if (KEY("submit_lead")) {
			cfg->submit_lead_ns = ns;
		} else if (KEY("max_lease")) {
			if (ns < NS_PER_S) {
				return say(msg, msg_len, -EINVAL, "plugstack.conf max_lease='%s': at "
					   "least 1s", v);
			}
			cfg->max_lease_ns = ns;
		} else {
			if (ns < 1000000 || ns > 600 * NS_PER_S) {
				return say(msg, msg_len, -EINVAL, "plugstack.conf timeout='%s': between "
					   "1ms and 10m", v);
			}
			cfg->timeout_ms = (int)(ns / 1000000);
		}
		return 0;
	}
	if (KEY("cpuset_check")) {
		if (strcmp(v, "yes") == 0 || strcmp(v, "no") == 0) {
			cfg->cpuset_check = v[0] == 'y';
			return 0;
		}
		return say(msg, msg_len, -EINVAL, "plugstack.conf cpuset_check='%s': yes or no", v);
	}
#undef KEY
	return say(msg, msg_len, -EINVAL,
		   "plugstack.conf: unknown argument '%.*s' (keys: socket, state_dir, cluster, "
		   "setup_margin, max_lease, submit_lead, timeout, cpuset_check, qrtd_node, "
		   "qrtd_nodes, lease)",
		   (int)klen, arg);
}

int qrt_slurm_build_request(const qrt_slurm_options *o, const qrt_slurm_config *cfg,
			    int64_t now_ns, int64_t job_end_ns, qrt_slurm_request *out, char *msg,
			    size_t msg_len)
{
	char when[48];
	const char *deadline_name = o->from_comment ? "the comment's deadline" : "--qpu-deadline";
	memset(out, 0, sizeof(*out));
	out->from_comment = o->from_comment;
	if (o->duration_ns <= 0) {
		return say(msg, msg_len, -EINVAL, "%s was not given",
			   o->from_comment ? "the comment's duration" : "--qpu-duration");
	}
	out->duration_ns = o->duration_ns;
	out->count = o->count;
	out->min_fidelity = o->min_fidelity;
	out->priority = o->priority;
	out->not_before_ns = now_ns + cfg->setup_margin_ns;
	if (o->not_before_set) {
		out->not_before_ns = o->not_before_relative ? now_ns + o->not_before_ns : o->not_before_ns;
	}
	if (out->not_before_ns < now_ns) {
		out->not_before_ns = now_ns;
	}
	/* The lease: until the job's end (its time limit), at most max_lease. */
	int64_t lease_end = now_ns + cfg->max_lease_ns;
	if (job_end_ns > 0 && job_end_ns < lease_end) {
		lease_end = job_end_ns;
		out->deadline_from_job = 1;
	}
	if (lease_end - now_ns < NS_PER_S) {
		qrt_slurm_format_utc(job_end_ns, when, sizeof(when));
		return say(msg, msg_len, -ERANGE,
			   "the job's time limit ends at %s, less than 1 s from now: no time for a "
			   "QPU slot",
			   when);
	}
	out->lease_ns = lease_end - now_ns;
	/* The slot must end while the reservation can still be held. */
	out->deadline_ns = lease_end;
	if (o->deadline_set) {
		const int64_t d = o->deadline_relative ? now_ns + o->deadline_ns : o->deadline_ns;
		if (d <= out->deadline_ns) {
			out->deadline_ns = d;
			out->deadline_from_job = 0;
		}
	}
	if (out->deadline_ns <= now_ns) {
		qrt_slurm_format_utc(out->deadline_ns, when, sizeof(when));
		return say(msg, msg_len, -ERANGE, "%s %s is already past", deadline_name, when);
	}
	if (out->not_before_ns + out->duration_ns > out->deadline_ns) {
		char nb[48];
		qrt_slurm_format_utc(out->not_before_ns, nb, sizeof(nb));
		qrt_slurm_format_utc(out->deadline_ns, when, sizeof(when));
		return say(msg, msg_len, -ERANGE,
			   "a slot of %" PRId64 " ns starting no earlier than %s cannot end by %s (%s)",
			   out->duration_ns, nb, when,
			   out->deadline_from_job ? "the job's time limit" : deadline_name);
	}
	return 0;
}

int qrt_slurm_request_text(const qrt_slurm_options *o, char *buf, size_t len)
{
	char nb[40] = "-";
	char dl[40] = "-";
	char pr[16] = "-";
	if (o->not_before_set) {
		snprintf(nb, sizeof(nb), "%s%" PRId64, o->not_before_relative ? "+" : "@",
			 o->not_before_ns);
	}
	if (o->deadline_set) {
		snprintf(dl, sizeof(dl), "%s%" PRId64, o->deadline_relative ? "+" : "@",
			 o->deadline_ns);
	}
	if (o->priority_set) {
		snprintf(pr, sizeof(pr), "%" PRId32, o->priority);
	}
	return put(buf, len, "duration=%" PRId64 ",count=%d,not_before=%s,deadline=%s,"
		   "min_fidelity=%.6g,priority=%s",
		   o->duration_ns, o->count, nb, dl, o->min_fidelity, pr);
}

static void step_name(uint32_t step_id, char *buf, size_t len)
{
	switch (step_id) {
	case QRT_SLURM_STEP_BATCH: snprintf(buf, len, "batch"); break;
	case QRT_SLURM_STEP_EXTERN: snprintf(buf, len, "extern"); break;
	case QRT_SLURM_STEP_INTERACTIVE: snprintf(buf, len, "interactive"); break;
	case QRT_SLURM_STEP_PENDING: snprintf(buf, len, "pending"); break;
	default: snprintf(buf, len, "%" PRIu32, step_id); break;
	}
}

int qrt_slurm_cluster_ok(const char *name)
{
	size_t n = 0;
	for (; name[n] != '\0'; ++n) {
		const char c = name[n];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-')) {
			return 0;
		}
	}
	return n >= 1 && n <= 63;
}

int qrt_slurm_key(const char *cluster, uint32_t job_id, uint32_t step_id, char *buf, size_t len)
{
	char step[16];
	if (cluster[0] != '\0' && !qrt_slurm_cluster_ok(cluster)) {
		if (len > 0) {
			buf[0] = '\0';
		}
		return -EINVAL;
	}
	step_name(step_id, step, sizeof(step));
	return put(buf, len, "slurm:%s:%" PRIu32 ".%s", cluster[0] != '\0' ? cluster : "-",
		   job_id, step);
}

int qrt_slurm_job_key(const char *cluster, uint32_t job_id, char *buf, size_t len)
{
	if (cluster[0] != '\0' && !qrt_slurm_cluster_ok(cluster)) {
		if (len > 0) {
			buf[0] = '\0';
		}
		return -EINVAL;
	}
	return put(buf, len, "slurm:%s:%" PRIu32 ".job", cluster[0] != '\0' ? cluster : "-", job_id);
}

int qrt_slurm_key_is_job(const char *key, const char *cluster, uint32_t job_id)
{
	char prefix[128];
	if (put(prefix, sizeof(prefix), "slurm:%s:%" PRIu32 ".", cluster[0] != '\0' ? cluster : "-",
		job_id) < 0) {
		return 0;
	}
	return strncmp(key, prefix, strlen(prefix)) == 0;
}

int qrt_slurm_ids_text(const qrt_slurm_held *h, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < h->n; ++i) {
		if (put(buf + at, len - at, "%s%" PRIu64, i == 0 ? "" : ",", h->member[i].id) < 0) {
			return -ENOSPC;
		}
		at += strlen(buf + at);
	}
	return 0;
}

int qrt_slurm_qpus_text(const qrt_slurm_held *h, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < h->n; ++i) {
		if (put(buf + at, len - at, "%s%s", i == 0 ? "" : ",", h->member[i].qpu) < 0) {
			return -ENOSPC;
		}
		at += strlen(buf + at);
	}
	return 0;
}

int qrt_slurm_cpus_parse(const char *list, qrt_slurm_cpus *out)
{
	memset(out, 0, sizeof(*out));
	const char *p = list;
	while (*p == ' ' || *p == '\n') {
		++p;
	}
	if (*p == '\0') {
		return 0; /* the empty set */
	}
	for (;;) {
		const char *start = p;
		while (*p >= '0' && *p <= '9') {
			++p;
		}
		uint64_t lo = 0;
		uint64_t hi = 0;
		if (parse_u64(start, (size_t)(p - start), &lo) < 0) {
			return -EINVAL;
		}
		hi = lo;
		if (*p == '-') {
			start = ++p;
			while (*p >= '0' && *p <= '9') {
				++p;
			}
			if (parse_u64(start, (size_t)(p - start), &hi) < 0 || hi < lo) {
				return -EINVAL;
			}
		}
		if (hi >= QRT_SLURM_CPU_WORDS * 64) {
			return -ERANGE;
		}
		for (uint64_t c = lo; c <= hi; ++c) {
			out->bits[c / 64] |= UINT64_C(1) << (c % 64);
		}
		if (*p == ',') {
			++p;
			continue;
		}
		while (*p == ' ' || *p == '\n') {
			++p;
		}
		return *p == '\0' ? 0 : -EINVAL;
	}
}

int qrt_slurm_cpus_text(const qrt_slurm_cpus *s, char *buf, size_t len)
{
	size_t at = 0;
	int first = 1;
	buf[0] = '\0';
	const int max = QRT_SLURM_CPU_WORDS * 64;
	for (int c = 0; c < max; ++c) {
		if (!(s->bits[c / 64] & (UINT64_C(1) << (c % 64)))) {
			continue;
		}
		int e = c;
		while (e + 1 < max && (s->bits[(e + 1) / 64] & (UINT64_C(1) << ((e + 1) % 64)))) {
			++e;
		}
		const int rc = e > c ? put(buf + at, len - at, "%s%d-%d", first ? "" : ",", c, e)
				     : put(buf + at, len - at, "%s%d", first ? "" : ",", c);
		if (rc < 0) {
			return rc;
		}
		at += strlen(buf + at);
		first = 0;
		c = e;
	}
	return 0;
}

int qrt_slurm_cpus_overlap(const qrt_slurm_cpus *a, const qrt_slurm_cpus *b, char *buf, size_t len)
{
	qrt_slurm_cpus both;
	int n = 0;
	for (int i = 0; i < QRT_SLURM_CPU_WORDS; ++i) {
		both.bits[i] = a->bits[i] & b->bits[i];
		n += __builtin_popcountll(both.bits[i]);
	}
	if (buf != NULL && len > 0) {
		qrt_slurm_cpus_text(&both, buf, len);
	}
	return n;
}

int qrt_slurm_state_name(uint32_t job_id, uint32_t step_id, char *buf, size_t len)
{
	char step[16];
	step_name(step_id, step, sizeof(step));
	return put(buf, len, "%" PRIu32 ".%s", job_id, step);
}

int qrt_slurm_field_ok(const char *v, const char *also)
{
	for (const unsigned char *p = (const unsigned char *)v; *p != '\0'; ++p) {
		if (*p < 0x20 || *p == 0x7f || strchr(also, *p) != NULL) {
			return 0;
		}
	}
	return 1;
}

int qrt_slurm_held_lines(const qrt_slurm_held *h, char *buf, size_t len)
{
	char ids[QRT_SLURM_MAX_GANG * 21];
	char qpus[QRT_SLURM_MAX_GANG * 65];
	int ok = qrt_slurm_field_ok(h->key, "");
	for (int i = 0; i < h->n && ok; ++i) {
		ok = qrt_slurm_field_ok(h->member[i].qpu, ",");
	}
	if (!ok) {
		if (len > 0) {
			buf[0] = '\0';
		}
		return -EINVAL;
	}
	if (qrt_slurm_ids_text(h, ids, sizeof(ids)) < 0 ||
	    qrt_slurm_qpus_text(h, qpus, sizeof(qpus)) < 0) {
		return -ENOSPC;
	}
	return put(buf, len,
		   "key=%s\nids=%s\nqpus=%s\nfencing_token=%" PRIu64 "\nstart_ns=%" PRId64
		   "\nend_ns=%" PRId64 "\nlease_expires_ns=%" PRId64 "\n",
		   h->key, ids, qpus, h->fencing_token, h->start_ns, h->end_ns,
		   h->lease_expires_ns);
}

int qrt_slurm_state_format(const qrt_slurm_held *h, char *buf, size_t len)
{
	static const char header[] =
		"# spank_qrt: a step's reservation, released by the job epilog if the step "
		"could not\n";
	if (len <= sizeof(header) - 1) {
		return -ENOSPC;
	}
	memcpy(buf, header, sizeof(header));
	const int rc = qrt_slurm_held_lines(h, buf + sizeof(header) - 1, len - (sizeof(header) - 1));
	if (rc < 0) {
		buf[0] = '\0';
	}
	return rc;
}

static int parse_i64_field(const char *v, int64_t *out)
{
	const int neg = *v == '-';
	uint64_t u = 0;
	if (parse_u64(v + neg, strlen(v + neg), &u) < 0 || u > (uint64_t)INT64_MAX) {
		return -EINVAL;
	}
	*out = neg ? -(int64_t)u : (int64_t)u;
	return 0;
}

int qrt_slurm_state_parse(const char *text, qrt_slurm_held *out)
{
	memset(out, 0, sizeof(*out));
	char line[QRT_SLURM_MAX_GANG * 65 + 32];
	const char *p = text;
	int have = 0;
	int seen = 0; /* every field once: a second one is a line someone added */
	char qpus[QRT_SLURM_MAX_GANG * 65] = "";
	while (*p != '\0') {
		const char *nl = strchr(p, '\n');
		const size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
		if (n >= sizeof(line)) {
			return -EINVAL;
		}
		memcpy(line, p, n);
		line[n] = '\0';
		p += n + (nl != NULL ? 1 : 0);
		if (line[0] == '#' || line[0] == '\0') {
			continue;
		}
		char *eq = strchr(line, '=');
		if (eq == NULL) {
			return -EINVAL;
		}
		*eq = '\0';
		const char *k = line;
		const char *v = eq + 1;
		int64_t num = 0;
		static const char *const fields[] = {"key", "ids", "qpus", "fencing_token",
						     "start_ns", "end_ns", "lease_expires_ns"};
		for (int f = 0; f < (int)(sizeof(fields) / sizeof(fields[0])); ++f) {
			if (strcmp(k, fields[f]) == 0) {
				if (seen & (1 << f)) {
					return -EINVAL;
				}
				seen |= 1 << f;
			}
		}
		if (strcmp(k, "key") == 0) {
			if (copy(out->key, sizeof(out->key), v) < 0) {
				return -EINVAL;
			}
			have |= 1;
		} else if (strcmp(k, "ids") == 0) {
			char ids[sizeof(line)];
			copy(ids, sizeof(ids), v);
			char *save = NULL;
			for (char *t = strtok_r(ids, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
				uint64_t id = 0;
				if (out->n >= QRT_SLURM_MAX_GANG || parse_u64(t, strlen(t), &id) < 0 || id == 0) {
					return -EINVAL;
				}
				out->member[out->n++].id = id;
			}
			have |= 2;
		} else if (strcmp(k, "qpus") == 0) {
			copy(qpus, sizeof(qpus), v);
		} else if (strcmp(k, "fencing_token") == 0) {
			if (parse_i64_field(v, &num) < 0 || num < 0) {
				return -EINVAL;
			}
			out->fencing_token = (uint64_t)num;
			have |= 4;
		} else if (strcmp(k, "start_ns") == 0 || strcmp(k, "end_ns") == 0 ||
			   strcmp(k, "lease_expires_ns") == 0) {
			if (parse_i64_field(v, &num) < 0) {
				return -EINVAL;
			}
			*(k[0] == 's' ? &out->start_ns : k[0] == 'e' ? &out->end_ns
							      : &out->lease_expires_ns) = num;
		} else {
			return -EINVAL;
		}
	}
	if (have != 7 || out->n == 0) {
		return -EINVAL;
	}
	int i = 0;
	char *save = NULL;
	for (char *t = strtok_r(qpus, ",", &save); t != NULL && i < out->n;
	     t = strtok_r(NULL, ",", &save), ++i) {
		copy(out->member[i].qpu, sizeof(out->member[i].qpu), t);
	}
	return 0;
}

void qrt_slurm_format_utc(int64_t t_ns, char *buf, size_t len)
{
	const time_t secs = (time_t)(t_ns / NS_PER_S);
	const int ms = (int)((t_ns % NS_PER_S) / 1000000);
	struct tm tm;
	if (gmtime_r(&secs, &tm) == NULL) {
		snprintf(buf, len, "%" PRId64 " ns", t_ns);
		return;
	}
	char date[32];
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", date, ms);
}

void qrt_slurm_failure_message(const qrt_slurm_request *req, const char *reason,
			       const char *detail, int64_t next_start_ns, int64_t now_ns, char *buf,
			       size_t len)
{
	char nb[48];
	char dl[48];
	char next[160] = "";
	qrt_slurm_format_utc(req->not_before_ns, nb, sizeof(nb));
	qrt_slurm_format_utc(req->deadline_ns, dl, sizeof(dl));
	if (next_start_ns > 0) {
		char at[48];
		qrt_slurm_format_utc(next_start_ns, at, sizeof(at));
		snprintf(next, sizeof(next), "; the next possible start is %s (in %.1f s)", at,
			 (double)(next_start_ns - now_ns) / 1e9);
	} else if (reason != NULL && strcmp(reason, QRT_REASON_NO_FIT) == 0) {
		snprintf(next, sizeof(next), "; qrtd knows no start that fits these QPUs at all");
	}
	snprintf(buf, len,
		 "qrt: no QPU slot for this %s: %s (reason %s). Asked for %d QPU%s x %" PRId64
		 " ns from %s to %s (deadline: %s)%s",
		 req->from_comment ? "job" : "step",
		 detail != NULL && detail[0] != '\0' ? detail : "qrtd refused", reason != NULL ? reason : "?",
		 req->count, req->count == 1 ? "" : "s", req->duration_ns, nb, dl,
		 req->deadline_from_job ? "the job's time limit"
		 : req->from_comment    ? "the comment's deadline"
					: "--qpu-deadline",
		 next);
}
