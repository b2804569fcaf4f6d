/*
 * spank-harness: load a built SPANK plugin and call its callbacks as
 * slurmstepd does, with slurmstepd's privileges, without Slurm.
 *
 * It is the plugin's host: it defines the SPANK API the plugin calls
 * (spank_get_item, spank_getenv, spank_setenv, spank_option_register,
 * spank_context, ...), the job's environment those read and write, and
 * the answers of slurmctld (the step's start and nodes, the job's end,
 * ClusterName), and exports them (-rdynamic) so the dlopen'd plugin binds
 * to them, as it binds to slurmstepd's.  Slurm's host lists are libslurm's
 * own.  The plugin's own calls (libqrt-client, munge, qrtd) are real.
 *
 * Remote context (slurmstepd of one step on one node, one task), run as
 * root, in slurmstepd's order:
 *
 *   slurm_spank_init            root
 *   the options' callbacks      root (remote = 1), for each --option given
 *   slurm_spank_init_post_opt   root
 *   slurm_spank_user_init       euid/egid/groups of the job's user (seteuid,
 *                               as slurmstepd's _drop_privileges), then root
 *   fork of the task
 *   slurm_spank_task_post_fork  root, in slurmstepd
 *   slurm_spank_task_init       in the task, after setgroups/setgid/setuid to
 *                               the job's user; it then prints its QRT_*
 *                               environment and exits (1 when task_init
 *                               failed, as slurmstepd fails the task)
 *   slurm_spank_task_exit       root, after the task was reaped
 *   slurm_spank_exit            root
 *
 * Job-script context (slurmd's job epilog, root): slurm_spank_job_epilog.
 *
 * Observation: with --connect-log FILE every connect() made in this process
 * or its children (the plugin's, libqrt-client's, libmunge's) is appended to
 * FILE as "connect pid=P euid=U uid=U family=unix|inet|inet6 addr=A rc=R",
 * then passed on to the C library's connect.  The plugin's log lines go to
 * stderr as "spank-harness[euid U]: LEVEL: text".
 *
 * Usage:
 *   spank-harness PLUGIN [--context remote|job_epilog] [--job ID]
 *     [--step ID] [--node-id N] [--nnodes N] [--uid U] [--gid G]
 *     [--step-nodes HOSTLIST] [--step-start SECS] [--job-end SECS]
 *     [--cluster NAME] [--option NAME=VALUE]... [--env NAME=VALUE]...
 *     [--connect-log FILE] [--stop-after CALLBACK] [-- PLUGSTACK_ARG...]
 * --stop-after init_post_opt|user_init|task_post_fork ends the run there,
 * as a slurmstepd killed -9 would: no task_exit, no exit.
 * Exit status: 0 when the run went as asked (whatever the task did; its
 * status is printed as "task: exit N"), 2 for a usage or setup error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#define MAX_ENV 256
#define MAX_OPTS 32
#define MAX_GROUPS 256

struct spank_handle {
	int remote;
};

static struct {
	spank_context_t context;
	uint32_t job_id;
	uint32_t step_id;
	uint32_t node_id;
	uint32_t nnodes;
	uid_t uid;
	gid_t gid;
	gid_t groups[MAX_GROUPS];
	int ngroups;
	const char *step_nodes;
	time_t step_start;
	time_t job_end;
	const char *cluster;
	int task_id;         /* -1: outside a task */
	int task_exit_status;
	char *env[MAX_ENV];  /* the job's environment: NAME=VALUE, malloc'd */
	int nenv;
	struct spank_option opts[MAX_OPTS];
	int nopts;
	int registering;     /* inside slurm_spank_init */
	int connect_log;     /* fd, or -1 */
} job = {.context = S_CTX_REMOTE, .job_id = 1, .nnodes = 1, .task_id = -1, .connect_log = -1};

/* ------------------------------------------------------------ logging */

static void say(const char *level, const char *fmt, va_list ap)
{
	char line[4096];
	int n = snprintf(line, sizeof(line), "spank-harness[euid %u]: %s: ", (unsigned)geteuid(), level);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	dprintf(STDERR_FILENO, "%s\n", line);
}

#define LOGGER(name, level)                                                                        \
	void name(const char *fmt, ...)                                                            \
	{                                                                                          \
		va_list ap;                                                                        \
		va_start(ap, fmt);                                                                 \
		say(level, fmt, ap);                                                               \
		va_end(ap);                                                                        \
	}
LOGGER(slurm_info, "info")
LOGGER(slurm_error, "error")
LOGGER(slurm_verbose, "verbose")
LOGGER(slurm_debug, "debug")
LOGGER(slurm_debug2, "debug2")
LOGGER(slurm_debug3, "debug3")
LOGGER(slurm_spank_log, "spank")

/* ------------------------------------------------------------ connect() */

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	static int (*real)(int, const struct sockaddr *, socklen_t);
	if (real == NULL) {
		real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
	}
	const int rc = real(fd, addr, len);
	const int saved = errno;
	if (job.connect_log >= 0 && addr != NULL) {
		char where[PATH_MAX + 64] = "?";
		const char *family = "other";
		if (addr->sa_family == AF_UNIX) {
			const struct sockaddr_un *un = (const struct sockaddr_un *)(const void *)addr;
			family = "unix";
			snprintf(where, sizeof(where), "%s", un->sun_path[0] != '\0' ? un->sun_path : "@abstract");
		} else if (addr->sa_family == AF_INET) {
			const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)addr;
			char ip[INET_ADDRSTRLEN] = "";
			inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
			family = "inet";
			snprintf(where, sizeof(where), "%s:%u", ip, (unsigned)ntohs(in->sin_port));
		} else if (addr->sa_family == AF_INET6) {
			const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)addr;
			char ip[INET6_ADDRSTRLEN] = "";
			inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
			family = "inet6";
			snprintf(where, sizeof(where), "[%s]:%u", ip, (unsigned)ntohs(in6->sin6_port));
		}
		dprintf(job.connect_log, "connect pid=%d euid=%u uid=%u family=%s addr=%s rc=%d\n",
			(int)getpid(), (unsigned)geteuid(), (unsigned)getuid(), family, where,
			rc == 0 ? 0 : -saved);
	}
	errno = saved;
	return rc;
}

/* ------------------------------------------------------------ the SPANK API */

const char *spank_strerror(spank_err_t err)
{
	if (err == ESPANK_SUCCESS) {
		return "success";
	}
	switch (err) {
	case ESPANK_BAD_ARG: return "bad argument";
	case ESPANK_NOT_TASK: return "not in a task";
	case ESPANK_ENV_EXISTS: return "environment variable exists";
	case ESPANK_ENV_NOEXIST: return "no such environment variable";
	case ESPANK_NOSPACE: return "buffer too small";
	case ESPANK_NOT_REMOTE: return "not in the remote context";
	case ESPANK_NOT_AVAIL: return "not available";
	default: return "spank error";
	}
}

spank_context_t spank_context(void)
{
	return job.context;
}

int spank_remote(spank_t sp)
{
	return sp != NULL && sp->remote;
}

int spank_symbol_supported(const char *symbol)
{
	return symbol != NULL && strncmp(symbol, "slurm_spank_", 12) == 0;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	if (sp == NULL || opt == NULL || !job.registering || job.nopts >= MAX_OPTS) {
		return ESPANK_BAD_ARG;
	}
	job.opts[job.nopts++] = *opt;
	return ESPANK_SUCCESS;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	if (sp == NULL) {
		return ESPANK_BAD_ARG;
	}
	if (job.context == S_CTX_JOB_SCRIPT && item != S_JOB_UID && item != S_JOB_ID) {
		return ESPANK_NOT_AVAIL; /* slurmd's job script context: these two only */
	}
	va_list ap;
	va_start(ap, item);
	spank_err_t rc = ESPANK_SUCCESS;
	switch (item) {
	case S_JOB_UID: *va_arg(ap, uid_t *) = job.uid; break;
	case S_JOB_GID: *va_arg(ap, gid_t *) = job.gid; break;
	case S_JOB_ID: *va_arg(ap, uint32_t *) = job.job_id; break;
	case S_JOB_STEPID: *va_arg(ap, uint32_t *) = job.step_id; break;
	case S_JOB_NNODES: *va_arg(ap, uint32_t *) = job.nnodes; break;
	case S_JOB_NODEID: *va_arg(ap, uint32_t *) = job.node_id; break;
	case S_JOB_LOCAL_TASK_COUNT: *va_arg(ap, uint32_t *) = 1; break;
	case S_JOB_TOTAL_TASK_COUNT: *va_arg(ap, uint32_t *) = job.nnodes; break;
	case S_JOB_SUPPLEMENTARY_GIDS: {
		gid_t **gids = va_arg(ap, gid_t **);
		int *n = va_arg(ap, int *);
		*gids = job.groups;
		*n = job.ngroups;
		break;
	}
	case S_TASK_ID:
		if (job.task_id < 0) {
			rc = ESPANK_NOT_TASK;
		} else {
			*va_arg(ap, int *) = job.task_id;
		}
		break;
	case S_TASK_EXIT_STATUS: *va_arg(ap, int *) = job.task_exit_status; break;
	default: rc = ESPANK_NOT_AVAIL; break;
	}
	va_end(ap);
	return rc;
}

static int env_find(const char *name)
{
	const size_t n = strlen(name);
	for (int i = 0; i < job.nenv; ++i) {
		if (strncmp(job.env[i], name, n) == 0 && job.env[i][n] == '=') {
			return i;
		}
	}
	return -1;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	if (sp == NULL || var == NULL || buf == NULL || len <= 0) {
		return ESPANK_BAD_ARG;
	}
	if (!sp->remote) {
		return ESPANK_NOT_REMOTE;
	}
	const int i = env_find(var);
	if (i < 0) {
		return ESPANK_ENV_NOEXIST;
	}
	const char *v = job.env[i] + strlen(var) + 1;
	if (strlen(v) >= (size_t)len) {
		return ESPANK_NOSPACE;
	}
	memcpy(buf, v, strlen(v) + 1);
	return ESPANK_SUCCESS;
}

static int env_set(const char *name, const char *value, int overwrite)
{
	const int i = env_find(name);
	if (i >= 0 && !overwrite) {
		return ESPANK_ENV_EXISTS;
	}
	char *entry = NULL;
	if (asprintf(&entry, "%s=%s", name, value) < 0) {
		return ESPANK_ERROR;
	}
	if (i >= 0) {
		free(job.env[i]);
		job.env[i] = entry;
	} else if (job.nenv < MAX_ENV) {
		job.env[job.nenv++] = entry;
	} else {
		free(entry);
		return ESPANK_NOSPACE;
	}
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	if (sp == NULL || var == NULL || val == NULL) {
		return ESPANK_BAD_ARG;
	}
	if (!sp->remote) {
		return ESPANK_NOT_REMOTE;
	}
	return env_set(var, val, overwrite);
}

spank_err_t spank_unsetenv(spank_t sp, const char *var)
{
	if (sp == NULL || var == NULL) {
		return ESPANK_BAD_ARG;
	}
	const int i = env_find(var);
	if (i >= 0) {
		free(job.env[i]);
		job.env[i] = job.env[--job.nenv];
	}
	return ESPANK_SUCCESS;
}

/* ------------------------------------------------------------ slurmctld */

int slurm_get_job_steps(time_t update_time, uint32_t job_id, uint32_t step_id,
			job_step_info_response_msg_t **out, uint16_t show_flags)
{
	(void)update_time;
	(void)show_flags;
	if (job_id != job.job_id || step_id != job.step_id || job.step_nodes == NULL) {
		return SLURM_ERROR;
	}
	job_step_info_response_msg_t *m = calloc(1, sizeof(*m));
	job_step_info_t *s = calloc(1, sizeof(*s));
	if (m == NULL || s == NULL) {
		free(m);
		free(s);
		return SLURM_ERROR;
	}
	s->nodes = strdup(job.step_nodes);
	s->start_time = job.step_start;
	s->step_id.job_id = job_id;
	s->step_id.step_id = step_id;
	s->user_id = job.uid;
	m->job_step_count = 1;
	m->job_steps = s;
	*out = m;
	return SLURM_SUCCESS;
}

void slurm_free_job_step_info_response_msg(job_step_info_response_msg_t *m)
{
	if (m == NULL) {
		return;
	}
	for (uint32_t i = 0; i < m->job_step_count; ++i) {
		free(m->job_steps[i].nodes);
	}
	free(m->job_steps);
	free(m);
}

int slurm_get_end_time(uint32_t job_id, time_t *end)
{
	if (job_id != job.job_id) {
		return SLURM_ERROR;
	}
	*end = job.job_end;
	return SLURM_SUCCESS;
}

int slurm_load_ctl_conf(time_t update_time, slurm_conf_t **out)
{
	(void)update_time;
	slurm_conf_t *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		return SLURM_ERROR;
	}
	c->cluster_name = job.cluster != NULL ? strdup(job.cluster) : NULL;
	*out = c;
	return SLURM_SUCCESS;
}

void slurm_free_ctl_conf(slurm_conf_t *c)
{
	if (c != NULL) {
		free(c->cluster_name);
		free(c);
	}
}

/* ------------------------------------------------------------ the run */

static void usage(const char *why)
{
	fprintf(stderr, "spank-harness: %s\n(see the comment at the top of spank_harness.c)\n", why);
	exit(2);
}

static unsigned long number(const char *text, const char *what)
{
	char *end = NULL;
	errno = 0;
	const unsigned long v = strtoul(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0') {
		char msg[256];
		snprintf(msg, sizeof(msg), "%s: '%s' is not a number", what, text);
		usage(msg);
	}
	return v;
}

typedef int(spank_fn)(spank_t, int, char **);

static spank_fn *callback(void *plugin, const char *name)
{
	return (spank_fn *)dlsym(plugin, name);
}

static int call(void *plugin, const char *name, spank_t sp, int ac, char **av)
{
	spank_fn *f = callback(plugin, name);
	if (f == NULL) {
		return 0;
	}
	const int rc = f(sp, ac, av);
	dprintf(STDERR_FILENO, "spank-harness[euid %u]: called %s: %d\n", (unsigned)geteuid(), name, rc);
	return rc;
}

/* As slurmstepd around spank_user(): the job's groups, egid, euid. */
static void drop_effective(void)
{
	if (setgroups((size_t)job.ngroups, job.groups) < 0 || setegid(job.gid) < 0 ||
	    seteuid(job.uid) < 0) {
		perror("spank-harness: drop privileges");
		exit(2);
	}
}

static void reclaim(void)
{
	if (seteuid(0) < 0 || setegid(0) < 0 || setgroups(0, NULL) < 0) {
		perror("spank-harness: reclaim privileges");
		exit(2);
	}
}

static int run_task(void *plugin, spank_t sp, int ac, char **av, const char *stop_after)
{
	int go[2];
	if (pipe2(go, O_CLOEXEC) < 0) {
		perror("spank-harness: pipe");
		return 2;
	}
	const pid_t pid = fork();
	if (pid < 0) {
		perror("spank-harness: fork");
		return 2;
	}
	if (pid == 0) {
		char c;
		close(go[1]);
		/* slurmstepd's task: wait for the parent's post-fork work, then
		 * become the user for good. */
		while (read(go[0], &c, 1) < 0 && errno == EINTR) {
		}
		if (setgroups((size_t)job.ngroups, job.groups) < 0 || setgid(job.gid) < 0 ||
		    setuid(job.uid) < 0) {
			perror("spank-harness: task: setuid");
			_exit(2);
		}
		job.task_id = 0;
		const int rc = call(plugin, "slurm_spank_task_init", sp, ac, av);
		for (int i = 0; i < job.nenv; ++i) {
			if (strncmp(job.env[i], "QRT_", 4) == 0) {
				printf("task: %s\n", job.env[i]);
			}
		}
		fflush(stdout);
		_exit(rc == 0 ? 0 : 1);
	}
	close(go[0]);
	call(plugin, "slurm_spank_task_post_fork", sp, ac, av);
	if (stop_after != NULL && strcmp(stop_after, "task_post_fork") == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		dprintf(STDERR_FILENO, "spank-harness: stopped after task_post_fork\n");
		return 0;
	}
	close(go[1]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	job.task_exit_status = status;
	printf("task: exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	fflush(stdout);
	job.task_id = 0;
	call(plugin, "slurm_spank_task_exit", sp, ac, av);
	job.task_id = -1;
	return -1;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage("the plugin's path is required");
	}
	const char *path = argv[1];
	const char *stop_after = NULL;
	const char *options[MAX_OPTS];
	int noptions = 0;
	int i = 2;
	job.step_start = time(NULL);
	job.job_end = job.step_start + 600;
	for (; i < argc; ++i) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--") == 0) {
			++i;
			break;
		}
		if (v == NULL) {
			usage("an option needs a value");
		}
		++i;
		if (strcmp(a, "--context") == 0) {
			job.context = strcmp(v, "job_epilog") == 0 ? S_CTX_JOB_SCRIPT : S_CTX_REMOTE;
		} else if (strcmp(a, "--job") == 0) {
			job.job_id = (uint32_t)number(v, a);
		} else if (strcmp(a, "--step") == 0) {
			job.step_id = (uint32_t)number(v, a);
		} else if (strcmp(a, "--node-id") == 0) {
			job.node_id = (uint32_t)number(v, a);
		} else if (strcmp(a, "--nnodes") == 0) {
			job.nnodes = (uint32_t)number(v, a);
		} else if (strcmp(a, "--uid") == 0) {
			job.uid = (uid_t)number(v, a);
		} else if (strcmp(a, "--gid") == 0) {
			job.gid = (gid_t)number(v, a);
		} else if (strcmp(a, "--step-nodes") == 0) {
			job.step_nodes = v;
		} else if (strcmp(a, "--step-start") == 0) {
			job.step_start = (time_t)number(v, a);
		} else if (strcmp(a, "--job-end") == 0) {
			job.job_end = (time_t)number(v, a);
		} else if (strcmp(a, "--cluster") == 0) {
			job.cluster = v;
		} else if (strcmp(a, "--option") == 0) {
			if (noptions >= MAX_OPTS || strchr(v, '=') == NULL) {
				usage("--option NAME=VALUE");
			}
			options[noptions++] = v;
		} else if (strcmp(a, "--env") == 0) {
			const char *eq = strchr(v, '=');
			if (eq == NULL) {
				usage("--env NAME=VALUE");
			}
			char name[256];
			snprintf(name, sizeof(name), "%.*s", (int)(eq - v), v);
			env_set(name, eq + 1, 1);
		} else if (strcmp(a, "--connect-log") == 0) {
			job.connect_log = open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
			if (job.connect_log < 0) {
				perror(v);
				return 2;
			}
		} else if (strcmp(a, "--stop-after") == 0) {
			stop_after = v;
		} else {
			char msg[256];
			snprintf(msg, sizeof(msg), "unknown option %s", a);
			usage(msg);
		}
	}
	if (job.step_nodes != NULL) {
		/* As slurmctld would have it: a host list (libslurm's, which
		 * the plugin's slurm_hostlist_* bind to). */
		hostlist_t hl = slurm_hostlist_create(job.step_nodes);
		if (hl == NULL) {
			usage("--step-nodes is not a host list");
		}
		slurm_hostlist_destroy(hl);
	}
	const struct passwd *pw = getpwuid(job.uid);
	if (pw == NULL) {
		usage("--uid names no user");
	}
	job.ngroups = MAX_GROUPS;
	if (getgrouplist(pw->pw_name, job.gid, job.groups, &job.ngroups) < 0) {
		usage("the job's user is in too many groups");
	}
	const int ac = argc - i;
	char **av = argv + i;

	void *plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (plugin == NULL) {
		fprintf(stderr, "spank-harness: dlopen %s: %s\n", path, dlerror());
		return 2;
	}
	struct spank_handle handle = {.remote = job.context == S_CTX_REMOTE};
	spank_t sp = &handle;

	if (job.context == S_CTX_JOB_SCRIPT) {
		call(plugin, "slurm_spank_job_epilog", sp, ac, av);
		return 0;
	}
	job.registering = 1;
	if (call(plugin, "slurm_spank_init", sp, ac, av) != 0) {
		return 0; /* slurmstepd would end the step here */
	}
	job.registering = 0;
	for (int k = 0; k < noptions; ++k) {
		const char *eq = strchr(options[k], '=');
		int found = 0;
		for (int o = 0; o < job.nopts && !found; ++o) {
			if (strlen(job.opts[o].name) == (size_t)(eq - options[k]) &&
			    strncmp(job.opts[o].name, options[k], (size_t)(eq - options[k])) == 0) {
				found = 1;
				const int rc = job.opts[o].cb != NULL
						       ? job.opts[o].cb(job.opts[o].val, eq + 1, 1)
						       : 0;
				dprintf(STDERR_FILENO, "spank-harness[euid %u]: option --%s: %d\n",
					(unsigned)geteuid(), job.opts[o].name, rc);
			}
		}
		if (!found) {
			usage("--option names no option the plugin registered");
		}
	}
	call(plugin, "slurm_spank_init_post_opt", sp, ac, av);
	if (stop_after != NULL && strcmp(stop_after, "init_post_opt") == 0) {
		return 0;
	}
	drop_effective();
	call(plugin, "slurm_spank_user_init", sp, ac, av);
	reclaim();
	if (stop_after != NULL && strcmp(stop_after, "user_init") == 0) {
		return 0;
	}
	const int t = run_task(plugin, sp, ac, av, stop_after);
	if (t >= 0) {
		return t;
	}
	call(plugin, "slurm_spank_exit", sp, ac, av);
	return 0;
}
