/*
 * qrt-client-example: what a Slurm SPANK plugin (or a prolog script helper)
 * does with libqrt-client, in plain C:
 *
 *   1. connect to the agent and say hello (api version, our roles);
 *   2. ask for candidate slots for a job of --duration-ns, starting at
 *      least --lead-ms from now;
 *   3. reserve one under an idempotency key (the Slurm job id is a good
 *      one: a retried prolog gets the same reservation back);
 *   4. submit the payload into the held reservation with its fencing token;
 *   5. read the job's status back.
 *
 * Any failure prints the agent's stable reason and exits with the same
 * status qrtctl would (qrt_exit_code_for_reason), so scripts can branch on
 * it.  Build against the installed library with
 *   cc example.c $(pkg-config --cflags --libs qrt-client)
 *
 * Usage: qrt-client-example [--socket PATH] [--qpu NAME] [--duration-ns N]
 *                           [--lead-ms N] [--key KEY] [--payload TEXT] [--release]
 *
 * --lead-ms: the slot starts at least this long from now (default 1000), so
 * the payload is committed before the slot begins.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <qrt/client.h>

static int fail(const char *what, int rc, const qrt_error *err)
{
	fprintf(stderr, "qrt-client-example: %s: %s (reason %s, code %d, rc %d)\n", what,
		err->message, err->reason, err->code, rc);
	return qrt_exit_code_for_reason(err->reason);
}

static void usage(FILE *out)
{
	fprintf(out, "usage: qrt-client-example [--socket PATH] [--qpu NAME] "
		     "[--duration-ns N] [--lead-ms N] [--key KEY] [--payload TEXT] [--release]\n");
}

/* A strictly positive decimal integer, or -1. */
static long long positive(const char *text)
{
	char *end = NULL;
	errno = 0;
	long long v = strtoll(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0' || v <= 0) {
		return -1;
	}
	return v;
}

static int64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	const char *socket_path = NULL; /* NULL: $QRT_SOCKET or the default */
	const char *qpu = NULL;
	const char *payload = "example payload";
	char key_buf[64];
	const char *key = NULL;
	int64_t duration_ns = 1000000; /* 1 ms */
	int64_t lead_ns = 1000000000;  /* 1 s */
	int release_only = 0;
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"qpu", required_argument, NULL, 'q'},
		{"duration-ns", required_argument, NULL, 'd'},
		{"lead-ms", required_argument, NULL, 'l'},
		{"key", required_argument, NULL, 'k'},
		{"payload", required_argument, NULL, 'p'},
		{"release", no_argument, NULL, 'r'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "s:q:d:l:k:p:rh", opts, NULL)) != -1) {
		switch (opt) {
		case 's': socket_path = optarg; break;
		case 'q': qpu = optarg; break;
		case 'd':
		case 'l': {
			long long v = positive(optarg);
			if (v < 0 || (opt == 'l' && v > INT64_MAX / 1000000)) {
				fprintf(stderr, "qrt-client-example: --%s '%s' is not a positive "
						"integer\n", opt == 'd' ? "duration-ns" : "lead-ms", optarg);
				return 64;
			}
			if (opt == 'd') {
				duration_ns = (int64_t)v;
			} else {
				lead_ns = (int64_t)v * 1000000;
			}
			break;
		}
		case 'k': key = optarg; break;
		case 'p': payload = optarg; break;
		case 'r': release_only = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 64;
		}
	}
	if (key == NULL) {
		/* A SPANK plugin would use the Slurm job id here. */
		snprintf(key_buf, sizeof(key_buf), "example-%ld", (long)getpid());
		key = key_buf;
	}

	qrt_error err;
	qrt_client *c = NULL;
	int rc = qrt_connect(socket_path, &c, &err);
	if (rc < 0) {
		return fail("connect", rc, &err);
	}
	int status = 0;

	char *json = NULL;
	rc = qrt_hello(c, &json, &err);
	if (rc < 0) {
		status = fail("agent.hello", rc, &err);
		goto out;
	}
	printf("hello %s\n", json);
	qrt_free(json);

	qrt_slot_request req;
	memset(&req, 0, sizeof(req));
	req.duration_ns = duration_ns;
	req.not_before_ns = realtime_ns() + lead_ns;
	req.qpu = qpu;
	rc = qrt_slots_query(c, &req, &json, &err);
	if (rc < 0) {
		status = fail("slots.query", rc, &err);
		goto out;
	}
	printf("query %s\n", json);
	qrt_free(json);

	qrt_reservation r;
	rc = qrt_slots_reserve(c, &req, key, 0, &r, &err);
	if (rc < 0) {
		status = fail("slots.reserve", rc, &err);
		goto out;
	}
	printf("reserved id=%" PRIu64 " token=%" PRIu64 " qpu=%s start_ns=%" PRId64
	       " end_ns=%" PRId64 " calibration_id=%" PRIu64 " state=%s\n",
	       r.reservation_id, r.fencing_token, r.qpu, r.start_ns, r.end_ns, r.calibration_id,
	       r.state);

	if (release_only) {
		rc = qrt_slots_release(c, r.reservation_id, r.fencing_token, &err);
		if (rc < 0) {
			status = fail("slots.release", rc, &err);
			goto out;
		}
		printf("released id=%" PRIu64 "\n", r.reservation_id);
		goto out;
	}

	qrt_reservation job;
	rc = qrt_jobs_submit(c, r.reservation_id, r.fencing_token, payload, strlen(payload), &job,
			     &err);
	if (rc < 0) {
		status = fail("jobs.submit", rc, &err);
		/* Give the slot back rather than let its lease run out. */
		(void)qrt_slots_release(c, r.reservation_id, r.fencing_token, NULL);
		goto out;
	}
	printf("submitted job=%" PRIu64 " state=%s\n", job.reservation_id, job.state);

	rc = qrt_jobs_status(c, job.reservation_id, &job, &err);
	if (rc < 0) {
		status = fail("jobs.status", rc, &err);
		goto out;
	}
	printf("status job=%" PRIu64 " state=%s qpu=%s start_ns=%" PRId64 "\n", job.reservation_id,
	       job.state, job.qpu, job.start_ns);

out:
	qrt_close(c);
	return status;
}
