/*
 * qrt-slurm-prolog: QPU slots from qrtd for Slurm sites that load no SPANK
 * plugin, per job instead of per step, keyed by SLURM_JOB_ID.  One program,
 * three slurm.conf entries (Prolog, TaskProlog, Epilog); the usage below
 * (--help) says what each does.
 *
 * It is spank_qrt.so's twin and shares its semantics rather than copying
 * them: the request (durations, +/@ times, limits, the deadline and lease
 * from the job's time limit), the key, the state file's fields and the
 * messages come from the plugin's core (qrt_slurm.c, qrt_slurm_job.c), the
 * calls to qrtd from qrt_slurm_user.c, made by a child that became the
 * job's user for good: root never calls qrtd (spank_qrt(8), WHO TALKS TO
 * QRTD).
 *
 * What root acts on: slurmd's Prolog and Epilog environment (SLURM_JOB_ID,
 * SLURM_JOB_UID, SLURM_JOB_GID, SLURM_CLUSTER_NAME: slurmd's, not the
 * job's), the command line, scontrol's answer, and its own record, read
 * back only from a root-owned file nobody else can write.  The job's
 * comment is the user's: it becomes a request that only the child, as that
 * user, sends; and what the record says (ids, token) the Epilog again only
 * acts on as that user.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qrt_slurm.h"
#include "qrt_slurm_user.h"
#include <qrt/names.h>

#define NS_PER_S INT64_C(1000000000)
/* Each call to qrtd. */
#define CALL_TIMEOUT_MS 10000
/* scontrol show job. */
#define SCONTROL_TIMEOUT_MS 20000

extern char **environ;

static const char usage[] =
	"usage: qrt-slurm-prolog [prolog|task-prolog|epilog] [--socket PATH] [--state-dir DIR]\n"
	"                        [--setup-margin SECONDS] [--max-lease SECONDS]\n"
	"                        [--submit-lead SECONDS]\n";

static const char help[] =
	"qrt-slurm-prolog: QPU slots from qrtd for sites that load no SPANK plugin.\n"
	"\n"
	"The same semantics as spank_qrt.so, per job instead of per step, keyed by\n"
	"SLURM_JOB_ID.  One program, three slurm.conf entries:\n"
	"\n"
	"    Prolog=/usr/sbin/qrt-slurm-prolog       (root, on the node, job start)\n"
	"    TaskProlog=/usr/sbin/qrt-slurm-prolog   (the job's user, each task)\n"
	"    Epilog=/usr/sbin/qrt-slurm-prolog       (root, on the node, job end)\n"
	"\n"
	"It tells the three apart by SLURM_SCRIPT_CONTEXT (prolog_slurmd,\n"
	"epilog_slurmd) and, for the TaskProlog, by running as the job's user; or\n"
	"give the mode as the first argument (prolog, task-prolog, epilog).\n"
	"\n"
	"The job asks through its comment (the Prolog sees no job option):\n"
	"\n"
	"    sbatch --comment \"qpu:duration=2ms,count=2,deadline=+30s\" job.sh\n"
	"\n"
	"keys: duration (required), count, deadline, not-before, min-fidelity,\n"
	"priority; values as spank_qrt's --qpu-* options take them (+DURATION from\n"
	"the job's start, or @UNIX_SECONDS).\n"
	"\n"
	"Prolog     reserves as the job's user (a child drops to SLURM_JOB_UID, its\n"
	"           gid and groups, before it connects, so the reservation is the\n"
	"           user's and the tasks can submit into it), key\n"
	"           slurm:<cluster>:<job>.job, lease and deadline until the job's\n"
	"           end time (scontrol show job), and writes /run/qrtd-slurm/<job>.job\n"
	"           (root's, read-only to others).  Idempotent: run again, it gets\n"
	"           the same reservation back.\n"
	"TaskProlog prints `export QRT_...=` lines, so every task has QRT_SOCKET,\n"
	"           QRT_RESERVATION_ID, QRT_SLOT_START_NS, QRT_SLOT_END_NS, QRT_QPUS,\n"
	"           QRT_FENCING_TOKEN and QRT_SUBMIT_BY_NS; when the reservation\n"
	"           failed, QRT_ERROR and a `print` line with the reason.\n"
	"Epilog     releases (held) or cancels (committed, with its fencing token)\n"
	"           the reservation as the job's user (a child drops to\n"
	"           SLURM_JOB_UID first: root never calls qrtd, so it needs no admin\n"
	"           role), then removes the file.  Idempotent.\n"
	"\n"
	"Limits against the SPANK plugin: a Prolog that fails drains the node and\n"
	"requeues the job, and a TaskProlog cannot fail a task, so a reservation\n"
	"that cannot be made does NOT fail the job here: the job sees QRT_ERROR\n"
	"(and the reason on its stdout) and must check it.  Every mode exits 0\n"
	"unless the command line (or slurmd's environment) is wrong (2).\n"
	"\n"
	"Options: --socket PATH or tcp://HOST:PORT (QRT_SOCKET, default\n"
	"/run/qrtd/qrtd.sock), --state-dir DIR (default /run/qrtd-slurm),\n"
	"--setup-margin SECONDS (2), --max-lease SECONDS (3600, at least 1),\n"
	"--submit-lead SECONDS (0.3).\n"
	"Examples:\n"
	"    qrt-slurm-prolog prolog --socket /run/lab/qrtd.sock   (SLURM_JOB_* set)\n"
	"    qrt-slurm-prolog --help\n";

enum mode { MODE_NONE, MODE_PROLOG, MODE_TASK_PROLOG, MODE_EPILOG };

static int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The usage and what is wrong with the command line: exit status 2. */
static int bad_usage(const char *fmt, ...)
{
	va_list ap;
	fputs(usage, stderr);
	fprintf(stderr, "qrt-slurm-prolog: error: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

static int64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* SECONDS of an option: a finite number, at least min. */
static int seconds(const char *text, double min, int64_t *out_ns)
{
	char *end = NULL;
	errno = 0;
	const double v = strtod(text, &end);
	if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < min || v > 1e9) {
		return -1;
	}
	*out_ns = (int64_t)llround(v * 1e9);
	return 0;
}

/* A strictly decimal u32 from slurmd's environment. */
static int env_u32(const char *name, uint32_t *out)
{
	const char *v = getenv(name);
	char *end = NULL;
	if (v == NULL || v[0] < '0' || v[0] > '9') {
		return -1;
	}
	errno = 0;
	const unsigned long long n = strtoull(v, &end, 10);
	if (errno != 0 || *end != '\0' || n > UINT32_MAX) {
		return -1;
	}
	*out = (uint32_t)n;
	return 0;
}

/* The job's user from slurmd's Prolog or Epilog environment (not the
 * job's, which its user writes). */
static int job_user(qrt_slurm_user *u, char *why, size_t len)
{
	uint32_t uid = 0;
	uint32_t gid = 0;
	if (env_u32("SLURM_JOB_UID", &uid) < 0) {
		snprintf(why, len, "SLURM_JOB_UID is not set to a uid (run from slurmd's Prolog or "
			 "Epilog)");
		return -2;
	}
	const int have_gid = getenv("SLURM_JOB_GID") != NULL;
	if (have_gid && env_u32("SLURM_JOB_GID", &gid) < 0) {
		snprintf(why, len, "SLURM_JOB_GID is not a gid");
		return -2;
	}
	return qrt_slurm_user_of((uid_t)uid, have_gid ? (gid_t)gid : (gid_t)-1, u, why, len);
}

/* Read fd until its end, at most cap - 1 bytes and limit_ms: 1 when it
 * ended, 0 when the time or the room ran out.  buf is NUL-terminated. */
static int read_bounded(int fd, char *buf, size_t cap, int64_t limit_ms)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	size_t got = 0;
	int done = 0;
	while (!done && got < cap - 1) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		const int64_t spent = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
				      (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (spent >= limit_ms) {
			break;
		}
		struct pollfd p = {.fd = fd, .events = POLLIN};
		const int r = poll(&p, 1, (int)(limit_ms - spent));
		if (r < 0 && errno == EINTR) {
			continue;
		}
		if (r <= 0) {
			break;
		}
		const ssize_t n = read(fd, buf + got, cap - 1 - got);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0) {
			done = 1;
		} else {
			got += (size_t)n;
		}
	}
	buf[got] = '\0';
	return done;
}

/* `scontrol show job JOB -o`: the job's start and expected end (its time
 * limit); 0 for what it does not say.  Bounded by SCONTROL_TIMEOUT_MS. */
static void job_times_ns(uint32_t job, int64_t *start_ns, int64_t *end_ns)
{
	*start_ns = 0;
	*end_ns = 0;
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0) {
		return;
	}
	char id[16];
	snprintf(id, sizeof(id), "%" PRIu32, job);
	char *const argv[] = {"scontrol", "show", "job", id, "-o", NULL};
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
	posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	pid_t pid = 0;
	const int rc = posix_spawnp(&pid, "scontrol", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(fds[1]);
	if (rc != 0) {
		close(fds[0]);
		return;
	}
	static char out[65536];
	const int done = read_bounded(fds[0], out, sizeof(out), SCONTROL_TIMEOUT_MS);
	close(fds[0]);
	if (!done) {
		kill(pid, SIGKILL);
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	struct tm tm;
	if (qrt_slurm_scontrol_time(out, "StartTime", &tm) == 0) {
		const time_t t = mktime(&tm);
		*start_ns = t > 0 ? (int64_t)t * NS_PER_S : 0;
	}
	if (qrt_slurm_scontrol_time(out, "EndTime", &tm) == 0) {
		const time_t t = mktime(&tm);
		*end_ns = t > 0 ? (int64_t)t * NS_PER_S : 0;
	}
}

/* ------------------------------------------------------------ the job's record */

struct args {
	qrt_slurm_config cfg; /* socket, state_dir, setup_margin, max_lease, submit_lead */
	enum mode mode;
	uint32_t job;
};

static void record_path(const struct args *a, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%" PRIu32 ".job", a->cfg.state_dir, a->job);
}

/* The state directory: root's and writable only by root, because the
 * Epilog (root) acts on what it finds there.  1 when it is. */
static int state_dir_ok(const struct args *a, int create)
{
	struct stat st;
	if (create && mkdir(a->cfg.state_dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "qrt-slurm-prolog: mkdir %s: %s\n", a->cfg.state_dir, strerror(errno));
		return 0;
	}
	if (lstat(a->cfg.state_dir, &st) < 0) {
		if (errno != ENOENT) {
			fprintf(stderr, "qrt-slurm-prolog: %s: %s\n", a->cfg.state_dir, strerror(errno));
		}
		return 0;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
		fprintf(stderr, "qrt-slurm-prolog: %s must be a directory owned by root and writable "
			"only by root; not used\n", a->cfg.state_dir);
		return 0;
	}
	return 1;
}

static void write_record(const struct args *a, const qrt_slurm_job_record *r)
{
	char text[QRT_SLURM_MAX_GANG * 90 + QRT_SLURM_MSG + 1024];
	char path[600];
	char tmp[610];
	if (qrt_slurm_job_record_format(r, text, sizeof(text)) < 0) {
		fprintf(stderr, "qrt-slurm-prolog: job %" PRIu32 ": the record has a field that does "
			"not fit a state file; none written\n", a->job);
		return;
	}
	if (!state_dir_ok(a, 1)) {
		return;
	}
	record_path(a, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "qrt-slurm-prolog: open %s: %s\n", tmp, strerror(errno));
		return;
	}
	const size_t len = strlen(text);
	const ssize_t w = write(fd, text, len);
	const int err = errno;
	/* Readable by the job's user (the TaskProlog), whatever the umask. */
	const int mode_ok = fchmod(fd, 0644) == 0;
	close(fd);
	if (w != (ssize_t)len || !mode_ok || rename(tmp, path) < 0) {
		fprintf(stderr, "qrt-slurm-prolog: write %s: %s\n", path,
			strerror(w != (ssize_t)len ? err : errno));
		unlink(tmp);
	}
}

/* The job's record: 1 with *r, 0 when there is none, -1 when there is one
 * that is not root's alone or does not parse (said on stderr). */
static int read_record(const struct args *a, qrt_slurm_job_record *r)
{
	char path[600];
	char text[QRT_SLURM_MAX_GANG * 90 + QRT_SLURM_MSG + 1024];
	record_path(a, path, sizeof(path));
	const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT) {
			return 0;
		}
		fprintf(stderr, "qrt-slurm-prolog: %s: %s\n", path, strerror(errno));
		return -1;
	}
	struct stat st;
	ssize_t n = -1;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
	    (st.st_mode & 022) == 0 && state_dir_ok(a, 0)) {
		n = read(fd, text, sizeof(text) - 1);
	}
	close(fd);
	if (n < 0) {
		fprintf(stderr, "qrt-slurm-prolog: %s is not root's alone; ignored\n", path);
		return -1;
	}
	text[n] = '\0';
	if (qrt_slurm_job_record_parse(text, r) < 0) {
		fprintf(stderr, "qrt-slurm-prolog: %s does not parse\n", path);
		return -1;
	}
	return 1;
}

static void failed_record(const struct args *a, const char *key, const char *reason,
			  const char *error)
{
	qrt_slurm_job_record r;
	memset(&r, 0, sizeof(r));
	snprintf(r.held.key, sizeof(r.held.key), "%s", key);
	snprintf(r.reason, sizeof(r.reason), "%s", reason);
	snprintf(r.error, sizeof(r.error), "%s", error);
	fprintf(stderr, "qrt-slurm-prolog: job %" PRIu32 ": %s\n", a->job, error);
	write_record(a, &r);
}

/* ------------------------------------------------------------ the modes */

struct reserve_work {
	const struct args *a;
	const qrt_slurm_request *req;
	const char *key;
};

/* In the child, as the job's user: "H\n" and the reservation's state
 * lines, or "E <reason>\n" and the message the job reads. */
static void reserve_child(void *arg, char *out, size_t len)
{
	const struct reserve_work *w = arg;
	const qrt_slurm_request *req = w->req;
	qrt_error err;
	qrt_slurm_held h;
	char msg[QRT_SLURM_MSG];
	qrt_client *c = qrt_slurm_connect(w->a->cfg.socket, CALL_TIMEOUT_MS, &err);
	if (c == NULL) {
		snprintf(out, len, "E %s\nqrt: no QPU slot for this job: cannot reach qrtd at %s: %s "
			 "(reason %s)", err.reason, w->a->cfg.socket, err.message, err.reason);
		return;
	}
	if (qrt_slurm_reserve(c, req, req->not_before_ns, req->deadline_ns, w->key, &h, &err) < 0) {
		const int64_t next = strcmp(err.reason, QRT_REASON_NO_FIT) == 0 ||
					     strcmp(err.reason, QRT_REASON_DEADLINE_PASSED) == 0
				     ? qrt_slurm_earliest_start(c, req, req->not_before_ns, NULL, 0)
				     : 0;
		qrt_slurm_failure_message(req, err.reason, err.message, next, realtime_ns(), msg,
					  sizeof(msg));
		snprintf(out, len, "E %s\n%s", err.reason, msg);
	} else if (len > 2 && qrt_slurm_state_format(&h, out + 2, len - 2) == 0) {
		out[0] = 'H';
		out[1] = '\n';
	} else {
		snprintf(out, len, "E client_error\nqrt: no QPU slot for this job: qrtd's answer does "
			 "not fit a state file");
	}
	qrt_close(c);
}

static int do_prolog(const struct args *a)
{
	qrt_slurm_user user;
	char why[QRT_SLURM_MSG];
	char key[160] = "";
	char msg[QRT_SLURM_MSG];
	const int who = job_user(&user, why, sizeof(why));
	if (who == -2) {
		fprintf(stderr, "qrt-slurm-prolog: prolog: %s\n", why);
		return 2;
	}
	const char *cluster = getenv("SLURM_CLUSTER_NAME");
	if (qrt_slurm_job_key(cluster != NULL ? cluster : "", a->job, key, sizeof(key)) < 0) {
		failed_record(a, "", "invalid_argument",
			      "qrt: no QPU slot for this job: slurm.conf's ClusterName is not a name "
			      "for the job's key (1 to 63 letters, digits, '.', '_' or '-')");
		return 0;
	}
	qrt_slurm_options opts;
	const int asked = qrt_slurm_comment_options(getenv("SLURM_JOB_COMMENT"), &opts, msg,
						    sizeof(msg));
	if (asked == 0) {
		return 0;
	}
	if (asked < 0) {
		snprintf(why, sizeof(why), "qrt: the job comment's qpu: request: %.900s", msg);
		failed_record(a, key, "invalid_argument", why);
		return 0;
	}
	if (who < 0) {
		snprintf(msg, sizeof(msg), "qrt: no QPU slot for this job: the job's user: %.900s", why);
		failed_record(a, key, "client_error", msg);
		return 0;
	}
	/* Times count from the job's start as slurmctld records it, so a
	 * retried Prolog sends the same request and gets the same reservation. */
	int64_t start = 0;
	int64_t end = 0;
	job_times_ns(a->job, &start, &end);
	qrt_slurm_request req;
	if (qrt_slurm_build_request(&opts, &a->cfg, start > 0 ? start : realtime_ns(), end, &req,
				    msg, sizeof(msg)) < 0) {
		snprintf(why, sizeof(why), "qrt: no QPU slot for this job: %.900s", msg);
		failed_record(a, key, "invalid_argument", why);
		return 0;
	}
	struct reserve_work w = {a, &req, key};
	char out[QRT_SLURM_MAX_GANG * 90 + QRT_SLURM_MSG];
	/* Connecting (at most 2 s), the reservation and the query after a
	 * refusal. */
	if (qrt_slurm_as_user(&user, 4000 + 2 * (int64_t)CALL_TIMEOUT_MS, reserve_child, &w, out,
			      sizeof(out), why, sizeof(why)) < 0) {
		snprintf(msg, sizeof(msg), "qrt: no QPU slot for this job: %.900s", why);
		failed_record(a, key, "client_error", msg);
		return 0;
	}
	qrt_slurm_job_record r;
	memset(&r, 0, sizeof(r));
	char reason[64] = "";
	int off = 0;
	if (out[0] == 'H' && qrt_slurm_state_parse(out + 2, &r.held) == 0 &&
	    strcmp(r.held.key, key) == 0) {
		snprintf(r.socket, sizeof(r.socket), "%s", a->cfg.socket);
		write_record(a, &r);
	} else if (sscanf(out, "E %63s\n%n", reason, &off) == 1 && off > 0) {
		failed_record(a, key, reason, out + off);
	} else {
		failed_record(a, key, "client_error",
			      "qrt: no QPU slot for this job: the reserving child's answer does not "
			      "parse");
	}
	return 0;
}

/* Slurm takes the rest of an `export` line as the value, verbatim: one
 * line, blanks collapsed. */
static void one_line(const char *in, char *out, size_t len)
{
	size_t n = 0;
	int blank = 1;
	for (const unsigned char *p = (const unsigned char *)in; *p != '\0' && n + 1 < len; ++p) {
		const int b = *p <= ' ' || *p == 0x7f;
		if (!b) {
			out[n++] = (char)*p;
		} else if (!blank) {
			out[n++] = ' ';
		}
		blank = b;
	}
	while (n > 0 && out[n - 1] == ' ') {
		--n;
	}
	out[n] = '\0';
}

static int do_task_prolog(const struct args *a)
{
	qrt_slurm_job_record r;
	char line[QRT_SLURM_MSG];
	const int got = read_record(a, &r);
	if (got == 0) {
		return 0;
	}
	if (got < 0) {
		snprintf(r.error, sizeof(r.error), "qrt: the job's reservation record in %s cannot be "
			 "used (see the node's log); no QPU slot for this job", a->cfg.state_dir);
	}
	if (got < 0 || r.held.n == 0) {
		one_line(r.error, line, sizeof(line));
		printf("export QRT_ERROR=%s\nprint %s\n", line, line);
		return 0;
	}
	char ids[QRT_SLURM_MAX_GANG * 21];
	char qpus[QRT_SLURM_MAX_GANG * 65];
	qrt_slurm_ids_text(&r.held, ids, sizeof(ids));
	qrt_slurm_qpus_text(&r.held, qpus, sizeof(qpus));
	printf("export QRT_SOCKET=%s\n"
	       "export QRT_RESERVATION_ID=%s\n"
	       "export QRT_QPUS=%s\n"
	       "export QRT_SLOT_START_NS=%" PRId64 "\n"
	       "export QRT_SLOT_END_NS=%" PRId64 "\n"
	       "export QRT_FENCING_TOKEN=%" PRIu64 "\n"
	       "export QRT_LEASE_EXPIRES_NS=%" PRId64 "\n"
	       "export QRT_IDEMPOTENCY_KEY=%s\n"
	       "export QRT_SUBMIT_BY_NS=%" PRId64 "\n",
	       r.socket, ids, qpus, r.held.start_ns, r.held.end_ns, r.held.fencing_token,
	       r.held.lease_expires_ns, r.held.key, r.held.start_ns - a->cfg.submit_lead_ns);
	return 0;
}

struct give_back_work {
	const qrt_slurm_job_record *r;
};

/* In the child, as the job's user: "<failed> <is_error> <message>". */
static void give_back_child(void *arg, char *out, size_t len)
{
	const struct give_back_work *w = arg;
	char msg[QRT_SLURM_MSG];
	int is_error = 1;
	const int rc = qrt_slurm_give_back(w->r->socket, CALL_TIMEOUT_MS, &w->r->held, "epilog",
					   msg, sizeof(msg), &is_error);
	snprintf(out, len, "%d %d %s", rc == 0 ? 0 : 1, is_error, msg);
}

static int do_epilog(const struct args *a)
{
	qrt_slurm_job_record r;
	char path[600];
	record_path(a, path, sizeof(path));
	const int got = read_record(a, &r);
	if (got == 0) {
		return 0;
	}
	if (got < 0) {
		/* Not root's alone: not ours to act on, nor to remove.  One
		 * that does not parse is root's own and useless: removed. */
		struct stat st;
		if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
		    (st.st_mode & 022) == 0 && state_dir_ok(a, 0)) {
			unlink(path);
		}
		return 0;
	}
	if (r.held.n > 0) {
		qrt_slurm_user user;
		char why[QRT_SLURM_MSG];
		const int who = job_user(&user, why, sizeof(why));
		if (who == -2) {
			fprintf(stderr, "qrt-slurm-prolog: epilog: %s\n", why);
			return 2;
		}
		struct give_back_work w = {&r};
		char out[QRT_SLURM_MSG + 16];
		int failed = 1;
		int is_error = 1;
		int off = 0;
		if (who < 0 ||
		    qrt_slurm_as_user(&user, 4000 + 2 * (int64_t)CALL_TIMEOUT_MS, give_back_child, &w,
				      out, sizeof(out), why, sizeof(why)) < 0) {
			/* Keep the file: the next Epilog run (or the lease) ends it. */
			fprintf(stderr, "qrt-slurm-prolog: epilog: job %" PRIu32 ": %s: not given back: "
				"%s\n", a->job, r.held.key, why);
			return 0;
		}
		if (sscanf(out, "%d %d %n", &failed, &is_error, &off) != 2 || off == 0) {
			fprintf(stderr, "qrt-slurm-prolog: epilog: job %" PRIu32 ": the child's answer "
				"'%.200s' does not parse\n", a->job, out);
			return 0;
		}
		fprintf(stderr, "qrt-slurm-prolog: epilog: job %" PRIu32 ": %s (as uid %u)\n", a->job,
			out + off, (unsigned)user.uid);
		if (failed) {
			return 0; /* kept: the next Epilog run (or the lease) ends it */
		}
	}
	unlink(path);
	return 0;
}

/* ------------------------------------------------------------ the command line */

static int parse_args(int argc, char **argv, struct args *a)
{
	static const struct option longs[] = {
		{"socket", required_argument, NULL, 's'},
		{"state-dir", required_argument, NULL, 'd'},
		{"setup-margin", required_argument, NULL, 'm'},
		{"max-lease", required_argument, NULL, 'l'},
		{"submit-lead", required_argument, NULL, 'b'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	char arg[300];
	char msg[QRT_SLURM_MSG];
	memset(a, 0, sizeof(*a));
	qrt_slurm_config_default(&a->cfg);
	a->cfg.timeout_ms = CALL_TIMEOUT_MS;
	const char *env_socket = getenv("QRT_SOCKET");
	if (env_socket != NULL && env_socket[0] != '\0') {
		snprintf(arg, sizeof(arg), "socket=%s", env_socket);
		if (qrt_slurm_config_arg(&a->cfg, arg, msg, sizeof(msg)) < 0) {
			return bad_usage("QRT_SOCKET: %s", msg);
		}
	}
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'h':
			fputs(help, stdout);
			exit(0);
		case 's':
		case 'd':
			snprintf(arg, sizeof(arg), "%s=%s", c == 's' ? "socket" : "state_dir", optarg);
			if (qrt_slurm_config_arg(&a->cfg, arg, msg, sizeof(msg)) < 0) {
				return bad_usage("%s", msg);
			}
			break;
		case 'm':
			if (seconds(optarg, 0, &a->cfg.setup_margin_ns) < 0) {
				return bad_usage("--setup-margin '%s' is not a number of seconds >= 0",
						 optarg);
			}
			break;
		case 'l':
			if (seconds(optarg, 1, &a->cfg.max_lease_ns) < 0) {
				return bad_usage("--max-lease '%s' is not a number of seconds >= 1",
						 optarg);
			}
			break;
		case 'b':
			if (seconds(optarg, 0, &a->cfg.submit_lead_ns) < 0) {
				return bad_usage("--submit-lead '%s' is not a number of seconds >= 0",
						 optarg);
			}
			break;
		default:
			return bad_usage("unrecognized or incomplete option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc) {
		const char *m = argv[optind];
		a->mode = strcmp(m, "prolog") == 0        ? MODE_PROLOG
			  : strcmp(m, "task-prolog") == 0 ? MODE_TASK_PROLOG
			  : strcmp(m, "epilog") == 0      ? MODE_EPILOG
							  : MODE_NONE;
		if (a->mode == MODE_NONE) {
			return bad_usage("mode '%s' is not prolog, task-prolog or epilog", m);
		}
		if (optind + 1 < argc) {
			return bad_usage("unexpected argument '%s'", argv[optind + 1]);
		}
	} else {
		const char *ctx = getenv("SLURM_SCRIPT_CONTEXT");
		ctx = ctx != NULL ? ctx : "";
		a->mode = strcmp(ctx, "prolog_slurmd") == 0   ? MODE_PROLOG
			  : strcmp(ctx, "epilog_slurmd") == 0 ? MODE_EPILOG
			  : strcmp(ctx, "task_prolog") == 0   ? MODE_TASK_PROLOG
			  : geteuid() != 0                    ? MODE_TASK_PROLOG
							      : MODE_NONE;
	}
	if (a->mode == MODE_NONE || getenv("SLURM_JOB_ID") == NULL) {
		return bad_usage("%s", "no mode: give prolog, task-prolog or epilog (or run from Slurm)");
	}
	if (env_u32("SLURM_JOB_ID", &a->job) < 0) {
		return bad_usage("SLURM_JOB_ID '%s' is not a job id", getenv("SLURM_JOB_ID"));
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct args a;
	const int rc = parse_args(argc, argv, &a);
	if (rc != 0) {
		return rc;
	}
	switch (a.mode) {
	case MODE_PROLOG: return do_prolog(&a);
	case MODE_TASK_PROLOG: return do_task_prolog(&a);
	case MODE_EPILOG: return do_epilog(&a);
	default: return 2;
	}
}
