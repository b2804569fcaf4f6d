/*
 * qrt-slurm-job-example: the job's side of spank_qrt, in C.
 *
 * Run as a task of a Slurm step that was given --qpu-duration: spank_qrt
 * reserved the slot before the task started and exported
 *   QRT_SOCKET          the node's qrtd socket
 *   QRT_RESERVATION_ID  the reservation(s), comma-separated (a gang of
 *                       --qpu-count=K has K, one per QPU of QRT_QPUS)
 *   QRT_FENCING_TOKEN   the token that guards them (one for a gang)
 *   QRT_SLOT_START_NS   when qrtd sends the payload to the QPU(s)
 *   QRT_SLOT_END_NS     when the slot ends
 *   QRT_QPUS            the QPU(s), in the order of QRT_RESERVATION_ID
 *   QRT_SUBMIT_BY_NS    submit before this (the start less qrtd's hand-over
 *                       lead)
 *
 * It commits the payload with jobs.submit into the reservation (one submit
 * commits every member of a gang: the same payload goes to each QPU at the
 * same start), waits for the job.finished events of every member, and
 * prints each member's result.  The payload must be in before
 * QRT_SUBMIT_BY_NS: after the slot's start a submit is refused (reason
 * lease_expired), and between the two the job may end `missed` (see
 * spank_qrt(8)).
 *
 * Usage: qrt-slurm-job-example [--payload TEXT] [--timeout-s N]
 * Exit: 0 when every member completed; otherwise the qrtctl status of the
 * reason (qrt_exit_code_for_reason), 64 for a bad command line or a
 * missing QRT_* variable.
 *
 * Build against the installed library:
 *   cc job_example.c $(pkg-config --cflags --libs qrt-client)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <qrt/client.h>
#include <qrt/names.h>

#define MAX_MEMBERS 64

static int64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A decimal QRT_* variable, or -1 (and a message) when missing or bad. */
static int64_t env_number(const char *name)
{
	const char *v = getenv(name);
	char *end = NULL;
	if (v == NULL || v[0] == '\0') {
		fprintf(stderr, "qrt-slurm-job-example: %s is not set: run me as a task of a step "
				"given --qpu-duration (spank_qrt)\n", name);
		return -1;
	}
	errno = 0;
	const long long n = strtoll(v, &end, 10);
	if (errno != 0 || *end != '\0' || n < 0) {
		fprintf(stderr, "qrt-slurm-job-example: %s='%s' is not a number\n", name, v);
		return -1;
	}
	return (int64_t)n;
}

static int fail(const char *what, const qrt_error *err)
{
	fprintf(stderr, "qrt-slurm-job-example: %s: %s (reason %s)\n", what, err->message,
		err->reason);
	return qrt_exit_code_for_reason(err->reason);
}

int main(int argc, char **argv)
{
	const char *payload = "H 0; CX 0 1; MEASURE";
	long timeout_s = 60;
	for (int i = 1; i < argc; ++i) {
		if (strcmp(argv[i], "--payload") == 0 && i + 1 < argc) {
			payload = argv[++i];
		} else if (strcmp(argv[i], "--timeout-s") == 0 && i + 1 < argc) {
			char *end = NULL;
			timeout_s = strtol(argv[++i], &end, 10);
			if (*end != '\0' || timeout_s <= 0) {
				fprintf(stderr, "qrt-slurm-job-example: --timeout-s needs a positive "
						"integer\n");
				return 64;
			}
		} else {
			fprintf(stderr, "usage: qrt-slurm-job-example [--payload TEXT] [--timeout-s N]\n"
					"  (in a Slurm step given --qpu-duration; see spank_qrt(8))\n");
			return strcmp(argv[i], "--help") == 0 ? 0 : 64;
		}
	}

	const char *ids_text = getenv("QRT_RESERVATION_ID");
	const int64_t token = env_number("QRT_FENCING_TOKEN");
	const int64_t start_ns = env_number("QRT_SLOT_START_NS");
	if (ids_text == NULL || token < 0 || start_ns < 0) {
		if (ids_text == NULL) {
			env_number("QRT_RESERVATION_ID");
		}
		return 64;
	}
	uint64_t ids[MAX_MEMBERS];
	int n = 0;
	char list[1024];
	snprintf(list, sizeof(list), "%s", ids_text);
	char *save = NULL;
	for (char *t = strtok_r(list, ",", &save); t != NULL && n < MAX_MEMBERS;
	     t = strtok_r(NULL, ",", &save)) {
		ids[n++] = strtoull(t, NULL, 10);
	}
	if (n == 0) {
		fprintf(stderr, "qrt-slurm-job-example: QRT_RESERVATION_ID is empty\n");
		return 64;
	}

	qrt_error err;
	qrt_client *c = NULL;
	if (qrt_connect(getenv("QRT_SOCKET"), &c, &err) < 0) {
		return fail("connect", &err);
	}
	int status = 0;
	/* Subscribe first, so no job.finished can slip past. */
	if (qrt_call(c, "events.subscribe", "{\"topics\":[\"job.finished\"]}", NULL, &err) < 0) {
		status = fail("events.subscribe", &err);
		goto out;
	}
	const char *by = getenv("QRT_SUBMIT_BY_NS");
	if (by != NULL && realtime_ns() > strtoll(by, NULL, 10)) {
		fprintf(stderr, "qrt-slurm-job-example: submitting after QRT_SUBMIT_BY_NS: qrtd may "
				"have handed a later slot to its dispatcher already, and then refuses "
				"this one as missed\n");
	}
	qrt_reservation job;
	if (qrt_jobs_submit(c, ids[0], (uint64_t)token, payload, strlen(payload), &job, &err) < 0) {
		status = fail("jobs.submit", &err);
		goto out;
	}
	printf("qrt-job: committed %d reservation%s (%s) for start_ns %" PRId64 " (in %.3f s)\n", n,
	       n == 1 ? "" : "s", ids_text, start_ns, (double)(start_ns - realtime_ns()) / 1e9);

	int finished = 0;
	int done[MAX_MEMBERS] = {0};
	const int64_t give_up = realtime_ns() + (int64_t)timeout_s * 1000000000;
	while (finished < n && realtime_ns() < give_up) {
		char *ev = NULL;
		const int rc = qrt_next_event(c, 1000, &ev, &err);
		if (rc == -ETIMEDOUT) {
			continue;
		}
		if (rc < 0) {
			status = fail("events", &err);
			goto out;
		}
		char idbuf[32];
		if (qrt_json_get(ev, "/data/reservation_id", idbuf, sizeof(idbuf)) == 0) {
			const uint64_t id = strtoull(idbuf, NULL, 10);
			for (int i = 0; i < n; ++i) {
				if (ids[i] == id && !done[i]) {
					done[i] = 1;
					++finished;
				}
			}
		}
		qrt_free(ev);
	}
	for (int i = 0; i < n; ++i) {
		void *bytes = NULL;
		size_t len = 0;
		qrt_reservation st;
		if (qrt_jobs_status(c, ids[i], &st, &err) < 0) {
			status = fail("jobs.status", &err);
			continue;
		}
		if (qrt_jobs_result(c, ids[i], &bytes, &len, NULL, &err) < 0) {
			printf("qrt-job: reservation %" PRIu64 " qpu %s state %s: no result (%s)\n",
			       ids[i], st.qpu, st.state, err.reason);
			status = qrt_exit_code_for_reason(strcmp(st.state, QRT_STATE_MISSED) == 0 ? QRT_REASON_MISSED
											  : err.reason);
			continue;
		}
		printf("qrt-job: reservation %" PRIu64 " qpu %s state %s start_ns %" PRId64
		       " result %zu bytes: %s\n",
		       ids[i], st.qpu, st.state, st.start_ns, len, (const char *)bytes);
		if (strcmp(st.state, QRT_STATE_COMPLETED) != 0 && status == 0) {
			status = 1;
		}
		qrt_free(bytes);
	}
out:
	qrt_close(c);
	return status;
}
