"""A real one-node Slurm on loopback with qrtd, for the Slurm test and bench.

Starts, from a fresh temporary directory and without systemd:
  munged      its own key and socket
  qpu-sim     two simulated QPU endpoints
  qrtd        as root, a test profile with two QPUs where the host has three
              cores or more, else one (each QPU needs its own isolated
              dispatch core and one core stays housekeeping); the partition
              applied.  The gang case then uses qrt-test-server, qrtd's
              socket side without dispatch, with two QPUs.
  slurmctld   ClusterName=qrtlab on 127.0.0.1, ports 16817/16818
  slurmd      this host as NodeName, with the lines `qrtd host plan --slurm`
              prints (CpuSpecList, task/cgroup, gres qpu:2, the health check)
and registers spank_qrt.so in plugstack.conf.  Jobs run as user nobody (the
qrtd tenant "nobody", role scheduler through group nogroup).

Every process it starts is stopped by PID in stop(), which the callers run
in a finally / tearDown; the Slurm cgroups slurmd created (slurm_<node>
in each v1 hierarchy, or under the v2 root) are removed when they did not
exist before.  Nothing here signals a process it did not start.

Environment: QRTD, QPU_SIM, QRTCTL, SPANK_QRT, JOB_EXAMPLE (binaries),
QRT_SLURM_TOOLS (tools/integrations/slurm), QRT_SLURM_PROLOG (the built qrt-slurm-prolog),
QRT_PYTHON_DIR (tools/clients/python/src).
"""

import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.environ.get("QRT_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "../../../tools/clients/python/src")))
import qrt_client  # noqa: E402

CLUSTER = "qrtlab"
NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = grp.getgrnam("nogroup").gr_gid
SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel",
                  "munged", "mungekey")


def why_not_here():
    """The reason this machine cannot run the lab, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd, munged and qrtd's partition)"
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return ("not installed: " + ", ".join(missing) +
                " (tools/dev/deps.sh installs slurmctld slurmd slurm-client munge)")
    for var in ("QRTD", "QPU_SIM", "QRTCTL"):
        if not os.environ.get(var):
            return f"{var} must name the built binary"
    if not os.environ.get("SPANK_QRT") or not os.path.exists(os.environ["SPANK_QRT"]):
        return "spank_qrt.so was not built (libslurm-dev missing at configure time)"
    if os.cpu_count() < 2:
        return "needs 2 CPUs (one isolated for dispatch, one for Slurm's tasks)"
    # Jobs run as user nobody and load spank_qrt.so, the clients and the
    # examples from the build tree: a checkout under a 0700 directory (such
    # as one made by mktemp -d) is out of nobody's reach.
    for var in ("SPANK_QRT", "QRTCTL"):
        path = os.environ[var]
        r = subprocess.run(["runuser", "-u", "nobody", "--", "test", "-r", path],
                           capture_output=True)
        if r.returncode != 0:
            return (f"user nobody, who runs the jobs, cannot read {path}: a parent directory "
                    "of the build tree is not searchable by others (chmod o+x it, or build "
                    "elsewhere)")
    return None


def wait_for(pred, timeout_s, step_s=0.1):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return pred()


def stepds_under(directory):
    """The slurmstepd processes holding a file under directory open (the
    spool of a slurmd that a lab started): its own, to be killed by PID."""
    pids = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/cmdline", "rb") as f:
                if not f.read().startswith(b"slurmstepd:"):
                    continue
            fds = os.listdir(f"/proc/{e}/fd")
            if any(os.readlink(f"/proc/{e}/fd/{fd}").startswith(directory) for fd in fds):
                pids.append(int(e))
        except OSError:
            continue
    return pids


QPU_CONFIG = """
[[qpu]]
name = "qpu{i}"
endpoint = "unix://{dir}/qpu{i}.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""


def qpus_here():
    """How many QPUs qrtd can dispatch here: each needs its own isolated
    core and one core stays housekeeping (rtcore's partition plan)."""
    cores = set()
    for cpu in os.listdir("/sys/devices/system/cpu"):
        path = f"/sys/devices/system/cpu/{cpu}/topology/core_id"
        pkg = f"/sys/devices/system/cpu/{cpu}/topology/physical_package_id"
        if cpu.startswith("cpu") and os.path.exists(path):
            with open(path) as a, open(pkg) as b:
                cores.add((b.read().strip(), a.read().strip()))
    return max(1, min(2, len(cores) - 1))


QRTD_CONFIG = """
[agent]
log_level = "info"
watchdog = false
# The lab's directories are root's: qrtd keeps root instead of dropping to
# user qrtd (e2e runs the deployed way).
user = "root"
[host]
apply_on_run = true
isolated_cpus = "auto"
# {isolation_why}
isolation = "{isolation}"
[dispatch]
# The dispatch thread stays untuned: slurmd's cpuset, made before qrtd's,
# shares the isolated CPU's domain, and the test is about Slurm, on a shared
# 2-CPU machine, not about lateness (e2e and bench/dispatch are).
mode = "untuned"
miss_tolerance_ns = 50_000_000
[timeline]
policy = "edf-backfill"
horizon_ns = 600_000_000_000
default_lease_ns = 60_000_000_000
[rpc]
socket_path = "{dir}/qrtd.sock"
# The socket in group root, open to every local user; the roles below decide
# what each may do.
socket_group = "root"
socket_mode = "0666"
[roles]
reader = ["group:nogroup"]
scheduler = ["group:nogroup", "uid:0"]
calibration = ["uid:0"]
admin = ["uid:0"]
[probes]
enabled = false

{qpus}"""

SLURM_CONF = """
ClusterName={cluster}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.sock
CredType=cred/munge
StateSaveLocation={dir}/ctld
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
SlurmdDebug=info
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
PlugStackConfig={dir}/plugstack.conf
MessageTimeout=20
KillWait=5
InactiveLimit=0
{plan}
PartitionName=qpu Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=FORCE:8 State=UP
"""


class Lab:
    def __init__(self, cpuspec=True):
        self.procs = {}  # name -> Popen
        self.dir = tempfile.mkdtemp(prefix="qrt-slurm-")
        os.chmod(self.dir, 0o755)
        self.node = socket.gethostname().split(".")[0]
        self.sock = os.path.join(self.dir, "qrtd.sock")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for d in ("log", "ctld", "spool", "munge", "state", "spank-state"):
            os.mkdir(os.path.join(self.dir, d), 0o700)
        os.chmod(os.path.join(self.dir, "munge"), 0o755)  # the socket, for every user
        self.jobs = os.path.join(self.dir, "jobs")
        os.mkdir(self.jobs, 0o777)
        os.chmod(self.jobs, 0o1777)
        # The job scripts root writes (and chmods): apart from jobs/, which
        # the jobs' user can write, in a directory only root writes.
        self.scripts = os.path.join(self.dir, "scripts")
        os.mkdir(self.scripts, 0o755)
        self.cgroups_before = self._slurm_cgroups()
        self.qrt_cgroups_before = self._qrt_cgroups()
        self.cpuspec = cpuspec
        self.nqpus = qpus_here()

    # ------------------------------------------------------------ start

    def start(self):
        # slurmd before qrtd, as a node boots: the health check drains the
        # node until qrtd answers, then resumes it.  (With a cgroup v1
        # isolated cpuset neither order works, hence isolation = "fence"
        # there: see write_qrtd_config.)
        self.start_munge()
        self.start_qpu_sim()
        self.write_qrtd_config()
        self.write_slurm_conf(cpuspec=self.cpuspec)
        self.start_slurmctld()
        self.start_slurmd(wait_idle=False)
        self.start_qrtd()
        self.wait_idle()

    def _spawn(self, name, argv, env=None):
        log = open(os.path.join(self.dir, "log", name + ".out"), "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env or self.env,
                             start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def start_munge(self):
        key = os.path.join(self.dir, "munge", "munge.key")
        subprocess.run(["mungekey", "--create", "--keyfile=" + key], check=True)
        os.chmod(key, 0o400)
        self._spawn("munged", ["munged", "--foreground", "--force",
                               "--socket=" + os.path.join(self.dir, "munge", "munge.sock"),
                               "--key-file=" + key,
                               "--pid-file=" + os.path.join(self.dir, "munge", "munged.pid"),
                               "--seed-file=" + os.path.join(self.dir, "munge", "seed"),
                               "--log-file=" + os.path.join(self.dir, "log", "munged.log")])
        if not wait_for(lambda: os.path.exists(os.path.join(self.dir, "munge", "munge.sock")), 10):
            raise RuntimeError("munged did not start: " + self.tail("munged.out"))

    def start_qpu_sim(self):
        self._spawn("qpu-sim", [os.environ["QPU_SIM"],
                                "--listen", f"unix://{self.dir}/qpu0.sock",
                                "--listen", f"unix://{self.dir}/qpu1.sock",
                                "--json", "--summary-file", os.path.join(self.dir, "sim.json"),
                                "--duration-s", "900"])
        if not wait_for(lambda: os.path.exists(f"{self.dir}/qpu1.sock"), 10):
            raise RuntimeError("qpu-sim did not listen: " + self.tail("qpu-sim.out"))

    def write_qrtd_config(self):
        # As `qrtd host plan --slurm` advises: on a cgroup v1 cpuset host the
        # fence, since a v1 isolated cpuset and slurmd's cpuset exclude each
        # other; elsewhere the best mode qrtd finds.
        v1 = os.path.exists("/sys/fs/cgroup/cpuset/cpuset.cpus")
        with open(os.path.join(self.dir, "qrtd.toml"), "w") as f:
            f.write(QRTD_CONFIG.format(
                dir=self.dir, isolation="fence" if v1 else "auto",
                isolation_why="cgroup v1 cpuset host: fence (see qrtd host plan --slurm)" if v1
                else "cgroup v2: the isolated partition",
                qpus="".join(QPU_CONFIG.format(i=i, dir=self.dir) for i in range(self.nqpus))))

    def start_qrtd(self):
        cfg = os.path.join(self.dir, "qrtd.toml")
        self.qrtd_starts = getattr(self, "qrtd_starts", 0) + 1
        name = f"qrtd-{self.qrtd_starts}"
        argv = [os.environ["QRTD"], "run", "-c", cfg, "--state-dir", os.path.join(self.dir, "state"),
                "--journal-dir", os.path.join(self.dir, "journal")]
        p = self._spawn(name, argv)
        self.procs["qrtd"] = p
        give_up = time.monotonic() + 30

        def up():
            nonlocal p
            if p.poll() is not None:
                # After a kill -9, the root helper of the killed qrtd holds
                # the state directory's lock until it has restored the host.
                if "another qrtd holds it" in self.tail(name + ".out") and time.monotonic() < give_up:
                    time.sleep(0.5)
                    p = self._spawn(name, argv)
                    self.procs["qrtd"] = p
                    return False
                raise RuntimeError("qrtd exited: " + self.tail(name + ".out"))
            try:
                with qrt_client.Client(self.sock, timeout=5) as c:
                    return all(q.get("endpoint_up") for q in c.status()["qpus"])
            except qrt_client.QrtError:
                return False
        if not wait_for(up, 30):
            raise RuntimeError("qrtd did not come up: " + self.tail(name + ".out"))
        return p

    def start_test_server(self):
        """qrt-test-server: qrtd's socket side (rpc server, methods, SQLite
        ledger) with qpu0 periodic and qpu1 pushed, and no dispatcher: for
        the gang case on a host whose cores let qrtd dispatch one QPU only."""
        sock = os.path.join(self.dir, "ledger-only.sock")
        self._spawn("qrt-test-server", [os.environ["QRT_TEST_SERVER"], "--socket", sock,
                                        "--store", os.path.join(self.dir, "ledger-only.db"),
                                        "--scheduler", "group:nogroup", "--reader", "group:nogroup",
                                        "--calibration", "uid:0", "--admin", "uid:0",
                                        "--duration-s", "900"])
        if not wait_for(lambda: os.path.exists(sock), 15):
            raise RuntimeError("qrt-test-server did not listen: " + self.tail("qrt-test-server.out"))
        return sock

    def point_plugin_at(self, sock):
        """plugstack.conf is read at each step launch: later steps use sock
        (None: no plugin at all, as at a site without SPANK)."""
        with open(os.path.join(self.dir, "plugstack.conf"), "w") as f:
            if sock is not None:
                f.write(f"required {os.environ['SPANK_QRT']} socket={sock} "
                        f"state_dir={self.dir}/spank-state setup_margin=3s\n")

    def use_prolog_scripts(self, on):
        """Without SPANK: qrt-slurm-prolog as Prolog, TaskProlog and Epilog."""
        wrapper = os.path.join(self.dir, "qrt-prolog.sh")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\n"
                    f"export SLURM_CONF={self.conf}\n"
                    f"exec {os.environ['QRT_SLURM_PROLOG']} --socket {self.sock} "
                    f"--state-dir {self.dir}/prolog-state --setup-margin 3 \"$@\"\n")
        os.chmod(wrapper, 0o755)
        self.point_plugin_at(None if on else self.sock)
        extra = [f"Prolog={wrapper}", f"Epilog={wrapper}", f"TaskProlog={wrapper}"] if on else []
        self.write_slurm_conf(cpuspec=True, extra=extra)
        self.scontrol("reconfigure")
        self.wait_idle()
        return wrapper

    def stop_qrtd(self, sig=signal.SIGTERM):
        p = self.procs.get("qrtd")
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait(30)

    def slurm_plan_lines(self):
        """`qrtd host plan --slurm --json`, as a site would paste it."""
        out = subprocess.run([os.environ["QRTD"], "host", "plan", "--slurm", "--json", "-c",
                              os.path.join(self.dir, "qrtd.toml")],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    def write_slurm_conf(self, cpuspec=True, extra=()):
        plan = self.slurm_plan_lines()
        hc = os.path.join(self.dir, "healthcheck.sh")
        with open(hc, "w") as f:
            f.write("#!/bin/sh\n"
                    f"export SLURM_CONF={self.conf} QRTCTL={os.environ['QRTCTL']}\n"
                    f"exec {os.environ['QRT_SLURM_TOOLS']}/qrt-slurm-healthcheck "
                    f"--socket {self.sock} --node {self.node} --timeout 2s\n")
        os.chmod(hc, 0o755)
        lines = []
        for line in plan["slurm_conf"]:
            if line.startswith("#"):
                continue
            if line.startswith("HealthCheckProgram="):
                line = "HealthCheckProgram=" + hc
            elif line.startswith("HealthCheckInterval="):
                line = "HealthCheckInterval=2"
            elif line.startswith("NodeName="):
                line += " NodeAddr=127.0.0.1 RealMemory=1000"
                if not cpuspec:
                    # A site that forgot the plan's CpuSpecList.
                    line = " ".join(w for w in line.split() if not w.startswith("CpuSpecList="))
            lines.append(line)
        lines += list(extra)
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(cluster=CLUSTER, node=self.node, dir=self.dir,
                                      plan="\n".join(lines)))
        with open(os.path.join(self.dir, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=autodetect\n" + "\n".join(plan["cgroup_conf"]) + "\n")
        with open(os.path.join(self.dir, "gres.conf"), "w") as f:
            f.write("\n".join(plan["gres_conf"]) + "\n")
        self.point_plugin_at(self.sock)
        self.plan = plan

    def start_slurmctld(self, clear=False):
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf] + (["-c"] if clear else []))
        if not wait_for(lambda: self.scontrol("ping").returncode == 0 and
                        "UP" in self.scontrol("ping").stdout, 30):
            raise RuntimeError("slurmctld did not answer: " + self.tail("slurmctld.log"))

    def start_slurmd(self, wait_idle=True):
        self._spawn("slurmd", ["slurmd", "-D", "-f", self.conf])
        if wait_idle:
            self.wait_idle()

    def wait_idle(self):
        def idle():
            st = self.node_state()
            return st and any(w in st[0] for w in ("IDLE", "MIXED", "ALLOCATED")) and \
                "DRAIN" not in st[0] and "NOT_RESPONDING" not in st[0]
        if not wait_for(idle, 40, 0.5):
            raise RuntimeError(f"node {self.node} never became idle: {self.node_state()} "
                               + self.tail("slurmd.log"))

    def restart_slurm(self, cpuspec):
        """Both daemons on a new slurm.conf: slurmctld keeps a node's
        CpuSpecList across `scontrol reconfigure`, so it restarts too, with
        its state cleared (call it with no job in the queue)."""
        self.stop_proc("slurmd")
        self.stop_proc("slurmctld")
        self.write_slurm_conf(cpuspec=cpuspec)
        self.start_slurmctld(clear=True)
        self.start_slurmd()

    # ------------------------------------------------------------ use

    def run(self, argv, user=True, timeout=120, **kw):
        if user:
            argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOGROUP}", "--clear-groups"] + argv
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout,
                              cwd=self.jobs, **kw)

    def scontrol(self, *args):
        return subprocess.run(["scontrol"] + list(args), env=self.env, capture_output=True,
                              text=True, timeout=60)

    def node_state(self):
        r = self.scontrol("show", "node", self.node, "-o")
        if r.returncode != 0:
            return None
        fields = dict(w.split("=", 1) for w in r.stdout.split() if "=" in w)
        reason = r.stdout.split("Reason=", 1)[1].strip() if "Reason=" in r.stdout else ""
        return fields.get("State", ""), reason

    def job_state(self, job_id):
        r = subprocess.run(["scontrol", "show", "job", str(job_id), "-o"], env=self.env,
                           capture_output=True, text=True)
        for w in r.stdout.split():
            if w.startswith("JobState="):
                return w.split("=", 1)[1]
        return None

    def wait_job_done(self, job_id, timeout_s=90):
        done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        return wait_for(lambda: self.job_state(job_id) in done and self.job_state(job_id),
                        timeout_s, 0.2)

    def client(self):
        return qrt_client.Client(self.sock, timeout=10)

    def tail(self, name, n=30):
        path = os.path.join(self.dir, "log", name)
        try:
            with open(path, errors="replace") as f:
                return f"\n--- {name} ---\n" + "".join(f.readlines()[-n:])
        except OSError:
            return f"(no {name})"

    # ------------------------------------------------------------ stop

    def stop_proc(self, name, timeout=20):
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def _our_stepds(self):
        return stepds_under(self.dir)

    @staticmethod
    def _qrt_cgroups():
        base = "/sys/fs/cgroup/cpuset"
        return {os.path.join(base, e) for e in (os.listdir(base) if os.path.isdir(base) else [])
                if e.startswith("qrt-")}

    def _slurm_cgroups(self):
        found = set()
        base = "/sys/fs/cgroup"
        for sub in [""] + (os.listdir(base) if os.path.isdir(base) else []):
            d = os.path.join(base, sub)
            if os.path.isdir(d):
                for e in os.listdir(d):
                    if e.startswith("slurm") and os.path.isdir(os.path.join(d, e)):
                        found.add(os.path.join(d, e))
        return found

    def stop(self):
        """Cancel every job, then stop every process this lab started, by PID."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--cluster", CLUSTER, "-u", "nobody"],
                           env=self.env, capture_output=True, timeout=30)
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env,
                           capture_output=True, timeout=30)
            wait_for(lambda: subprocess.run(["squeue", "-h"], env=self.env, capture_output=True,
                                            text=True).stdout.strip() == "", 30, 0.5)
        for name in ("slurmd", "slurmctld", "qrtd", "qrt-test-server", "qpu-sim", "munged"):
            self.stop_proc(name, timeout=40 if name == "qrtd" else 20)
        for name, p in self.procs.items():
            if p.poll() is None:
                p.kill()
                p.wait()
        # A slurmstepd of this lab's slurmd that outlived its job (its spool
        # socket is in this lab's directory).
        for pid in self._our_stepds():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # slurmd's cgroups, deepest first, when this lab made them; a task
        # still in one is a job's task whose slurmstepd was killed (case 5).
        for top in sorted(self._slurm_cgroups() - self.cgroups_before):
            for root, _, files in sorted(os.walk(top), key=lambda t: -len(t[0])):
                if "cgroup.procs" in files:
                    with open(os.path.join(root, "cgroup.procs")) as f:
                        for pid in f.read().split():
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                for _ in range(50):
                    try:
                        os.rmdir(root)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)

    def leftover_qrt_cgroups(self):
        """qrtd's cpusets that outlived it: its restore moves back the tasks
        it journaled, so a task forked into qrt-housekeeping after the sweep
        (slurmd's children here) keeps the cpuset alive past the restore.
        Removed here once empty, and returned so the caller can say so."""
        left = sorted(self._qrt_cgroups() - self.qrt_cgroups_before)
        for d in left:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        return left

    def cleanup(self):
        if os.environ.get("QRT_SLURM_KEEP"):
            print(f"kept {self.dir}", file=sys.stderr)
            return
        shutil.rmtree(self.dir, ignore_errors=True)
