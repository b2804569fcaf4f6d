/*
 * spank_qrt.h: what the parts of spank_qrt.so share (one step's state, one
 * slurmstepd or srun per step).  Internal: hidden from the symbols the
 * plugin exports, so nothing of slurmstepd's or srun's can bind to them.
 *
 *   spank_qrt.c       options, the request, the remote context (slurmstepd)
 *                     and the job epilog
 *   spank_qrt_srun.c  the local context (srun): one reservation for the
 *                     step, or a common start on every node, and its
 *                     heartbeat
 *   spank_qrt_state.c the step's state file and the job epilog
 *   spank_qrt_user.c  the job's user, and giving a slot back as that user
 *
 * The calls to qrtd themselves (reserve, query, give back, as the job's
 * user) are qrt_slurm_user.c's, which qrt-slurm-prolog shares.
 */
#ifndef SPANK_QRT_H
#define SPANK_QRT_H

#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>

#include <qrt/client.h>

#include "qrt_slurm.h"
#include "qrt_slurm_user.h"

#pragma GCC visibility push(hidden)

enum step_mode {
	MODE_OFF,     /* no --qpu-duration, or the extern step */
	MODE_OWN,     /* this step reserves (and releases) its slot */
	MODE_INHERIT, /* an outer step of the job, or srun, holds the slot (QRT_* inherited) */
	MODE_NODE,    /* srun reserved this node's part of a common start: exported
		       * here, released here at the last task's exit, as the job's user */
};

/* How many nodes a common-start step may span. */
#define MAX_NODES 64

/* One slurmstepd serves one step: module state is the step's state. */
extern qrt_slurm_config cfg;
extern char cfg_error[QRT_SLURM_MSG];
extern qrt_slurm_options opts;
extern char opt_error[QRT_SLURM_MSG];
extern enum step_mode mode;
extern uint32_t job_id;
extern uint32_t step_id;
extern char cluster[64];
extern char key[160];
extern char request_text[256];
extern qrt_slurm_request req;
extern qrt_slurm_held held;
extern int have_held;
extern char failure[QRT_SLURM_MSG];
/* The qrtd this step talks to: cfg.socket, or for a common-start step the
 * node's own (qrtd_node= with %n replaced by this node's name). */
extern char step_socket[256];

/* What slurmstepd logs at info goes to slurmd's log; in srun, info is the
 * user's terminal: there the plugin's notes wait for srun -v. */
#define note(...)                                                                                  \
	do {                                                                                       \
		if (spank_context() == S_CTX_LOCAL) {                                              \
			slurm_verbose(__VA_ARGS__);                                                \
		} else {                                                                           \
			slurm_info(__VA_ARGS__);                                                   \
		}                                                                                  \
	} while (0)

int64_t realtime_ns(void);
void fail_with(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int export_held(spank_t sp);
qrt_client *connect_to(const char *url, qrt_error *err);
int64_t earliest_start(qrt_client *c, int64_t not_before_ns, char *why, size_t why_len);
int reserve_into(qrt_client *c, int64_t not_before_ns, int64_t deadline_ns, const char *k,
		 qrt_slurm_held *h, qrt_error *err);
void reserve(qrt_client *c);
void prepare_request(spank_t sp);
void build_request(void);
/* The step's nodes, in its order (the relative node ids), from slurmctld;
 * in srun also from its own environment.  Their count, or -1. */
int step_nodes(char names[][64], int cap);
/* Whether every node of names has its own qrtd (qrtd_node=, and the node in
 * qrtd_nodes= when given). */
int nodes_have_qrtd(char names[][64], int n);
int get_u32(spank_t sp, spank_item_t item, uint32_t *out);
/* plugstack.conf's arguments into cfg (cfg_error on a wrong one). */
void parse_args(int ac, char **av);

/* The step's state file (spank_qrt_state.c): written once the step holds a
 * slot it reserved itself (0, or -1 logged), removed once it is given
 * back. */
int write_state(void);
void remove_state(uint32_t job, uint32_t step);

/* srun (local context): the step's reservations, released at srun's exit. */
void srun_exit(void);

/* The job's user: every call to qrtd the plugin makes is made as this user,
 * never as root (spank_qrt(8), WHO TALKS TO QRTD; qrt_slurm_user.h). */
typedef qrt_slurm_user job_user;

/* slurmstepd: the step's uid, gid and supplementary groups. */
int job_user_of_step(spank_t sp, job_user *u, char *why, size_t len);

/* qrt_slurm_give_back with the plugin's timeout=. */
int give_back_at(const char *url, const qrt_slurm_held *h, const char *who, char *msg,
		 size_t len, int *is_error);
/* give_back_at from a child process that has become u for good (groups,
 * gid, uid) before it connects; what it says is logged here.  0 or -1. */
int give_back_as(const job_user *u, const char *url, const qrt_slurm_held *h, const char *who);

#pragma GCC visibility pop

#endif /* SPANK_QRT_H */
