/* Drives qrt_place_best (libqrt-client's multi-agent placement) for
 * test_multi_agent.py, through the public header only:
 *
 *   place_best_check KEY DURATION_NS NOT_BEFORE_NS DEADLINE_NS SOCKET...
 *
 * Prints one JSON line: {"rc", "reason", "chosen", "per_agent": [...],
 * "reservation_id", "fencing_token", "start_ns", "state"} and exits 0
 * (the test asserts on the line). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qrt/client.h"

int main(int argc, char **argv) {
	if (argc < 6 || argc - 5 > 16) {
		fprintf(stderr, "usage: %s KEY DURATION_NS NOT_BEFORE_NS DEADLINE_NS SOCKET...\n", argv[0]);
		return 64;
	}
	const size_t n = (size_t)(argc - 5);
	qrt_client *agents[16] = {0};
	qrt_error err;
	for (size_t i = 0; i < n; ++i) {
		if (qrt_connect(argv[5 + i], &agents[i], &err) < 0) {
			fprintf(stderr, "connect %s: %s\n", argv[5 + i], err.message);
			return 69;
		}
	}
	/* Let the test stop an agent after every connection is up. */
	if (getenv("PLACE_BEST_PAUSE") != NULL) {
		printf("connected\n");
		fflush(stdout);
		char line[8];
		if (fgets(line, sizeof line, stdin) == NULL) {
			return 70;
		}
	}
	qrt_slot_request req;
	memset(&req, 0, sizeof req);
	req.duration_ns = strtoll(argv[2], NULL, 10);
	req.not_before_ns = strtoll(argv[3], NULL, 10);
	req.deadline_ns = strtoll(argv[4], NULL, 10);
	req.qpu = "qpu0";
	size_t chosen = 99;
	qrt_reservation r;
	memset(&r, 0, sizeof r);
	int per_agent[16] = {0};
	const int rc = qrt_place_best(agents, n, &req, argv[1], 0, &chosen, &r, per_agent, &err);
	printf("{\"rc\":%d,\"reason\":\"%s\",\"chosen\":%zu,\"per_agent\":[", rc, rc < 0 ? err.reason : "",
	       rc < 0 ? (size_t)99 : chosen);
	for (size_t i = 0; i < n; ++i) {
		printf("%s%d", i == 0 ? "" : ",", per_agent[i]);
	}
	printf("],\"reservation_id\":%llu,\"fencing_token\":%llu,\"start_ns\":%lld,\"state\":\"%s\"}\n",
	       (unsigned long long)r.reservation_id, (unsigned long long)r.fencing_token,
	       (long long)r.start_ns, r.state);
	for (size_t i = 0; i < n; ++i) {
		qrt_close(agents[i]);
	}
	return 0;
}
