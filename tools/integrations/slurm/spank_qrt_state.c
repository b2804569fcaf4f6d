/*
 * spank_qrt_state.c: a step's state file, and the job epilog that gives
 * back what a step left behind.
 *
 * slurmstepd (root) writes one file per step that holds a slot it reserved
 * itself (MODE_OWN) into state_dir, root's and writable by nobody else, and
 * removes it once the slot is given back.  slurmd's job epilog reads what
 * is left there (slurmstepd killed, qrtd down) and gives it back as the
 * job's user.  Every field comes from qrtd's answer and the step's key, and
 * qrt_slurm_state_format refuses a field that would break a line, so
 * nothing a user can set adds a line of its own.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "spank_qrt.h"

/* The state directory: root's, and writable by nobody else, because the
 * job epilog (root) acts on what it finds there. */
static int state_dir_ok(void)
{
	struct stat st;
	if (mkdir(cfg.state_dir, 0700) < 0 && errno != EEXIST) {
		slurm_error("qrt: mkdir %s: %s", cfg.state_dir, strerror(errno));
		return 0;
	}
	if (lstat(cfg.state_dir, &st) < 0) {
		slurm_error("qrt: stat %s: %s", cfg.state_dir, strerror(errno));
		return 0;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
		slurm_error("qrt: %s must be a directory owned by root and writable only by root; "
			    "not used",
			    cfg.state_dir);
		return 0;
	}
	return 1;
}

int write_state(void)
{
	char name[64];
	char path[512];
	char tmp[520];
	char text[QRT_SLURM_MAX_GANG * 90 + 512];
	if (!state_dir_ok() || qrt_slurm_state_name(job_id, step_id, name, sizeof(name)) < 0) {
		return -1;
	}
	if (qrt_slurm_state_format(&held, text, sizeof(text)) < 0) {
		slurm_error("qrt: %s: the step's reservation has a field that does not fit a state "
			    "file; none written (the step's end still gives it back)", key);
		return -1;
	}
	snprintf(path, sizeof(path), "%s/%s", cfg.state_dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		slurm_error("qrt: open %s: %s", tmp, strerror(errno));
		return -1;
	}
	const size_t len = strlen(text);
	const ssize_t w = write(fd, text, len);
	const int err = errno;
	close(fd);
	if (w != (ssize_t)len || rename(tmp, path) < 0) {
		slurm_error("qrt: write %s: %s", path, strerror(w < 0 ? err : errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

void remove_state(uint32_t job, uint32_t step)
{
	char name[64];
	char path[512];
	if (qrt_slurm_state_name(job, step, name, sizeof(name)) == 0) {
		snprintf(path, sizeof(path), "%s/%s", cfg.state_dir, name);
		unlink(path);
	}
}

/* slurmd's job epilog (job_script context, root): what a step left behind
 * when its slurmstepd died, or when qrtd could not be told at its end,
 * given back as the job's user (the only items here are the job id and the
 * uid; the gid and groups are the user's passwd and group entries').
 * Never fails: a non-zero job_epilog drains the node. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t job = 0;
	uid_t uid = 0;
	static job_user user;
	char prefix[32];
	char why[256];
	parse_args(ac, av);
	if (cfg_error[0] != '\0' || get_u32(sp, S_JOB_ID, &job) < 0) {
		return 0;
	}
	snprintf(prefix, sizeof(prefix), "%" PRIu32 ".", job);
	DIR *d = opendir(cfg.state_dir);
	if (d == NULL) {
		return 0; /* no step of any job left anything */
	}
	const spank_err_t rc = spank_get_item(sp, S_JOB_UID, &uid);
	if (rc != ESPANK_SUCCESS || qrt_slurm_user_of(uid, (gid_t)-1, &user, why, sizeof(why)) < 0) {
		slurm_error("qrt: job epilog: job %" PRIu32 ": the job's user is not known (%s); "
			    "what its steps left is not given back (their leases end it)", job,
			    rc != ESPANK_SUCCESS ? spank_strerror(rc) : why);
		closedir(d);
		return 0;
	}
	struct stat dst;
	if (fstat(dirfd(d), &dst) < 0 || dst.st_uid != 0 || (dst.st_mode & 022) != 0) {
		slurm_error("qrt: job epilog: %s is not root's alone; ignored", cfg.state_dir);
		closedir(d);
		return 0;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
		    strstr(e->d_name, ".tmp") != NULL) {
			continue;
		}
		const int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		struct stat st;
		char text[QRT_SLURM_MAX_GANG * 90 + 512];
		if (fd < 0) {
			continue;
		}
		ssize_t n = -1;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
		    (st.st_mode & 022) == 0) {
			n = read(fd, text, sizeof(text) - 1);
		}
		close(fd);
		qrt_slurm_held h;
		if (n <= 0) {
			continue;
		}
		text[n] = '\0';
		if (qrt_slurm_state_parse(text, &h) < 0) {
			slurm_error("qrt: job epilog: %s/%s does not parse; removed", cfg.state_dir,
				    e->d_name);
			unlinkat(dirfd(d), e->d_name, 0);
			continue;
		}
		if (give_back_as(&user, cfg.socket, &h, "job epilog") == 0) {
			unlinkat(dirfd(d), e->d_name, 0);
		}
	}
	closedir(d);
	return 0;
}
