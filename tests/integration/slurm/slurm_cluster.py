"""A real multi-node Slurm cluster on one machine, in network namespaces.

Five nodes, each a network namespace of its own (`ip netns`) with one veth
to a bridge that lives in a sixth namespace (the "switch"), so nothing is
added to the host's own network namespace:

  ctl    10.77.0.1   munged, slurmctld; srun/sbatch run here (the login node)
  cn1    10.77.0.11  munged, slurmd                     (compute, no QPU)
  cn2    10.77.0.12  munged, slurmd                     (compute, no QPU)
  qpu1   10.77.0.21  munged, slurmd, qpu-sim, qrtd      (QPU node)
  qpu2   10.77.0.22  munged, slurmd, qpu-sim, qrtd      (QPU node)

Every node's munged has the SAME key (made for the test with mungekey) and
its own socket: each node's processes run in a mount namespace of their own
(`ip netns exec` makes one) in which the node's munge directory is bound
over one common path, DIR/munge-here, so slurm.conf's AuthInfo=socket=,
qrtd's rpc.munge_socket and the clients' QRT_MUNGE_SOCKET name the same
path everywhere while each node reaches only its own munged.  A credential
encoded on cn1 is decoded by qpu1's munged: it really crosses the veth.
Each node's /etc/hosts (bound over the host's in its mount namespace, as
`ip netns exec` does with /etc/netns/<ns>/hosts, without writing to /etc)
gives the node names, and each node has its own UTS namespace (hostname
cn1, ...).

qrtd on each QPU node runs untuned (dispatch.mode "untuned",
host.isolation "none", no partition applied: two QPU nodes on a 2-CPU
machine cannot each isolate a core), with its UNIX socket in the node's
directory and rpc.listen on tcp://<node address>:7071.  The test itself,
in the host's namespaces, talks to each qrtd over its UNIX socket (a path
socket works across network namespaces) as root (admin).

Slurm runs without cgroups (proctrack/pgid, task/none), so five slurmd on
one host do not share cgroup paths; one slurm.conf for every node, with
%n in the slurmd paths.  Jobs run as user nobody (qrtd's scheduler role
through group nogroup).

Everything the cluster makes is undone by stop(), which the callers run in
a finally and which is also registered with atexit: its processes stopped
by PID, the slurmstepds its slurmds left killed by PID, its namespaces
(and with them the veths and the bridge) and its directory removed.
why_not_here() says why a machine cannot run it (callers exit 77).
Environment: as slurm_lab.py (QRTD, QPU_SIM, QRTCTL, SPANK_QRT, ...).
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurm_lab  # noqa: E402
from slurm_lab import NOBODY, NOGROUP, qrt_client, stepds_under, wait_for  # noqa: E402,F401

CLUSTER = "qrtc"
SUBNET = "10.77.0"
NODES = {  # name -> (last octet, role)
    "ctl": (1, "controller"),
    "cn1": (11, "compute"),
    "cn2": (12, "compute"),
    "qpu1": (21, "qpu"),
    "qpu2": (22, "qpu"),
}
QRTD_PORT = 7071
# qpu2's tenants.max_reservations (admins are exempt): small, so a test can
# fill a user's quota there and see a common start refused on one node.
QPU2_MAX_RESERVATIONS = 3

# qpu1's calibration window is one long one (a week, its blackout a day
# after the cluster starts), so that a calibration block due in a minute has
# the time in front of it and nowhere else; qpu2 calibrates every second.
QPU1_PERIOD_NS = 604_800_000_000_000
QPU1_PHASE_NS = (time.time_ns() + 86_400_000_000_000) % QPU1_PERIOD_NS

QRTD_CONFIG = """
[agent]
log_level = "info"
watchdog = false
user = "root"
[host]
# Two QPU nodes on one small machine: no partition, no isolated core.
apply_on_run = false
isolation = "none"
[dispatch]
mode = "untuned"
miss_tolerance_ns = 50_000_000
[timeline]
policy = "edf-backfill"
horizon_ns = 600_000_000_000
default_lease_ns = 60_000_000_000
[rpc]
socket_path = "{ndir}/qrtd.sock"
socket_group = "root"
socket_mode = "0666"
listen = "tcp://{addr}:{port}"
munge_socket = "{munge}"
[roles]
reader = ["group:nogroup"]
scheduler = ["group:nogroup", "uid:0"]
calibration = ["uid:0"]
admin = ["uid:0"]
[tenants]
max_reservations = {max_reservations}
[probes]
enabled = false

[[qpu]]
name = "{node}-q0"
endpoint = "unix://{ndir}/sim.sock"
calibration = "periodic"
period_ns = {period_ns}
blackout_ns = 100_000_000
phase_ns = {phase_ns}
fidelity_f0 = 0.99
"""

SLURM_CONF = """
ClusterName={cluster}
SlurmctldHost=ctl({subnet}.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge}
CredType=cred/munge
StateSaveLocation={dir}/ctld
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/run/slurmctld.pid
SlurmdPidFile={dir}/run/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
SlurmdDebug=info
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
PlugStackConfig={dir}/plugstack.conf
MessageTimeout=20
SlurmdTimeout=300
KillWait=5
InactiveLimit=0
{nodes}
PartitionName=compute Nodes=cn1,cn2 Default=YES MaxTime=INFINITE OverSubscribe=FORCE:8 State=UP
PartitionName=qpu Nodes=qpu1,qpu2 MaxTime=INFINITE OverSubscribe=FORCE:8 State=UP
"""


def addr(node):
    return f"{SUBNET}.{NODES[node][0]}"


def qrtd_url(node):
    return f"tcp://{node}:{QRTD_PORT}"


def why_not_here():
    """The reason this machine cannot run the cluster, or None."""
    why = slurm_lab.why_not_here()
    if why:
        return why
    for tool in ("ip", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"qrtc{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot make a network namespace (ip netns add): " + r.stderr.strip()
    try:
        r = subprocess.run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return "cannot make a bridge in a network namespace: " + r.stderr.strip()
        r = subprocess.run(["ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer",
                            "name", "b0"], capture_output=True, text=True)
        if r.returncode != 0:
            return "cannot make a veth pair: " + r.stderr.strip()
        r = subprocess.run(["nsenter", f"--net=/run/netns/{probe}", "unshare", "--mount",
                            "--uts", "--", "true"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return ("cannot make mount and UTS namespaces (unshare --mount --uts): " +
                    r.stderr.strip())
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Cluster:
    def __init__(self):
        self.procs = {}  # name -> Popen
        self.tag = f"qrtc{os.getpid() % 100000}"
        self.ns = {n: f"{self.tag}-{n}" for n in NODES}
        self.switch = f"{self.tag}-sw"
        self.made_ns = []
        self.dir = tempfile.mkdtemp(prefix="qrt-cluster-")
        os.chmod(self.dir, 0o755)
        self.munge = os.path.join(self.dir, "munge-here", "munge.sock")
        self.conf = os.path.join(self.dir, "slurm.conf")
        for d in ("log", "ctld", "spool", "run", "munge-here", "nodes", "spank-state"):
            os.mkdir(os.path.join(self.dir, d), 0o755)
        os.chmod(os.path.join(self.dir, "ctld"), 0o700)
        os.chmod(os.path.join(self.dir, "spank-state"), 0o700)
        self.jobs = os.path.join(self.dir, "jobs")
        os.mkdir(self.jobs)
        os.chmod(self.jobs, 0o1777)
        self.scripts = os.path.join(self.dir, "scripts")
        os.mkdir(self.scripts, 0o755)
        self.env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.conf,
                    "QRT_MUNGE_SOCKET": self.munge, "LANG": "C.UTF-8",
                    "QRT_PYTHON_DIR": os.environ.get("QRT_PYTHON_DIR", ""),
                    "PYTHONDONTWRITEBYTECODE": "1"}
        self.qrtd_starts = {}
        self._stopped = False
        # ctest's timeout sends SIGTERM: exit through atexit, which stops
        # the cluster, instead of dying with its namespaces up.
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        # slurmd makes no cgroup here (proctrack/pgid, task/none); should
        # one appear all the same, stop() removes it.
        self.cgroups_before = slurm_lab.Lab._slurm_cgroups(self)
        atexit.register(self.stop)

    def ndir(self, node):
        return os.path.join(self.dir, "nodes", node)

    def sock(self, node):
        return os.path.join(self.ndir(node), "qrtd.sock")

    # ------------------------------------------------------------ network

    def _ip(self, *args):
        r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
        return r

    def make_network(self):
        self._ip("netns", "add", self.switch)
        self.made_ns.append(self.switch)
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{addr(n)} {n}\n" for n in NODES)
        for node in NODES:
            ns = self.ns[node]
            os.makedirs(os.path.join(self.ndir(node), "munge"), 0o755, exist_ok=True)
            os.chmod(self.ndir(node), 0o755)
            with open(os.path.join(self.ndir(node), "hosts"), "w") as f:
                f.write(hosts)
            if node != "ctl":
                os.mkdir(os.path.join(self.dir, "spool", node), 0o755)
            self._ip("netns", "add", ns)
            self.made_ns.append(ns)
            # The switch's port is named after the node: `ip -n SW link set
            # cn1 down` cuts that node off.
            self._ip("-n", self.switch, "link", "add", node, "type", "veth", "peer", "name",
                     "eth0", "netns", ns)
            self._ip("-n", self.switch, "link", "set", node, "master", "br0", "up")
            self._ip("-n", ns, "addr", "add", addr(node) + "/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def link(self, node, up):
        """Cut (up=False) or restore the node's link to the switch."""
        self._ip("-n", self.switch, "link", "set", node, "up" if up else "down")

    # ------------------------------------------------------------ processes

    def in_node(self, node, argv, user=False):
        """argv as run on node: its network namespace (nsenter, which unlike
        `ip netns exec` leaves /sys and its cgroup mounts as they are), its
        own mount and UTS namespaces with its hostname, its /etc/hosts and
        its munged at DIR/munge-here (as user nobody when user)."""
        if user:
            argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOGROUP}", "--clear-groups"] + argv
        nd = self.ndir(node)
        return ["nsenter", f"--net=/run/netns/{self.ns[node]}", "unshare", "--mount", "--uts",
                "--propagation", "private", "--", "sh", "-c",
                'hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" "$4" && '
                'shift 4 && exec "$@"', "sh", node, os.path.join(nd, "hosts"),
                os.path.join(nd, "munge"), os.path.dirname(self.munge)] + argv

    def _spawn(self, name, node, argv, env=None):
        log = open(os.path.join(self.dir, "log", name + ".out"), "ab")
        p = subprocess.Popen(self.in_node(node, argv), stdout=log, stderr=subprocess.STDOUT,
                             env=env or self.env, start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def run(self, node, argv, user=True, timeout=120, env=None, **kw):
        return subprocess.run(self.in_node(node, argv, user=user), env=env or self.env,
                              capture_output=True, text=True, timeout=timeout, cwd=self.jobs,
                              **kw)

    def start(self):
        self.make_network()
        self.start_munge()
        for node in ("qpu1", "qpu2"):
            self.start_qpu_sim(node)
            self.start_qrtd(node)
        self.write_slurm_conf()
        self.point_plugin(None)
        self.start_slurmctld()
        for node in ("cn1", "cn2", "qpu1", "qpu2"):
            self._spawn("slurmd-" + node, node, ["slurmd", "-D", "-N", node, "-f", self.conf])
        self.wait_idle(["cn1", "cn2", "qpu1", "qpu2"])

    def start_munge(self):
        key = os.path.join(self.dir, "munge.key")
        subprocess.run(["mungekey", "--create", "--keyfile=" + key], check=True,
                       capture_output=True)
        for node in NODES:
            md = os.path.join(self.ndir(node), "munge")
            os.makedirs(md, 0o755, exist_ok=True)
            os.chmod(self.ndir(node), 0o755)
            os.chmod(md, 0o755)
            shutil.copyfile(key, os.path.join(md, "munge.key"))
            os.chmod(os.path.join(md, "munge.key"), 0o400)
            here = os.path.dirname(self.munge)
            self._spawn("munged-" + node, node,
                        ["munged", "--foreground", "--force", "--socket=" + self.munge,
                         "--key-file=" + os.path.join(here, "munge.key"),
                         "--pid-file=" + os.path.join(here, "munged.pid"),
                         "--seed-file=" + os.path.join(here, "seed"),
                         "--log-file=" + os.path.join(here, "munged.log")])
        os.unlink(key)
        for node in NODES:
            sock = os.path.join(self.ndir(node), "munge", "munge.sock")
            if not wait_for(lambda: os.path.exists(sock), 10):
                raise RuntimeError(f"munged on {node} did not start: " +
                                   self.tail(f"munged-{node}.out"))

    def start_qpu_sim(self, node):
        nd = self.ndir(node)
        self._spawn("qpu-sim-" + node, node,
                    [os.environ["QPU_SIM"], "--listen", f"unix://{nd}/sim.sock", "--json",
                     "--summary-file", os.path.join(nd, "sim.json"), "--duration-s", "900"])
        if not wait_for(lambda: os.path.exists(f"{nd}/sim.sock"), 10):
            raise RuntimeError(f"qpu-sim on {node} did not listen: " +
                               self.tail(f"qpu-sim-{node}.out"))

    def start_qrtd(self, node):
        nd = self.ndir(node)
        cfg = os.path.join(nd, "qrtd.toml")
        with open(cfg, "w") as f:
            f.write(QRTD_CONFIG.format(ndir=nd, addr=addr(node), port=QRTD_PORT,
                                       munge=self.munge, node=node,
                                       period_ns=QPU1_PERIOD_NS if node == "qpu1"
                                       else 1_000_000_000,
                                       phase_ns=QPU1_PHASE_NS if node == "qpu1" else 0,
                                       max_reservations=QPU2_MAX_RESERVATIONS
                                       if node == "qpu2" else 1000))
        for d in ("state", "journal"):
            os.makedirs(os.path.join(nd, d), 0o750, exist_ok=True)
        n = self.qrtd_starts[node] = self.qrtd_starts.get(node, 0) + 1
        name = f"qrtd-{node}-{n}"
        p = self._spawn(name, node, [os.environ["QRTD"], "run", "-c", cfg, "--state-dir",
                                     os.path.join(nd, "state"), "--journal-dir",
                                     os.path.join(nd, "journal")])
        self.procs["qrtd-" + node] = p

        def up():
            if p.poll() is not None:
                raise RuntimeError(f"qrtd on {node} exited: " + self.tail(name + ".out"))
            try:
                with qrt_client.Client(self.sock(node), timeout=5) as c:
                    return all(q.get("endpoint_up") for q in c.status()["qpus"])
            except qrt_client.QrtError:
                return False
        if not wait_for(up, 30):
            raise RuntimeError(f"qrtd on {node} did not come up: " + self.tail(name + ".out"))
        return p

    def kill_qrtd(self, node, sig=signal.SIGKILL):
        p = self.procs.get("qrtd-" + node)
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait(30)

    def client(self, node):
        """qrtd of node over its UNIX socket, as root (admin)."""
        return qrt_client.Client(self.sock(node), timeout=10)

    def point_plugin(self, args):
        """plugstack.conf, read by srun and slurmstepd at each step: the
        plugin with args (a list of key=value words), or None: no plugin."""
        with open(os.path.join(self.dir, "plugstack.conf"), "w") as f:
            if args is not None:
                f.write(f"required {os.environ['SPANK_QRT']} state_dir={self.dir}/spank-state "
                        + " ".join(args) + "\n")

    def write_slurm_conf(self):
        nodes = "\n".join(f"NodeName={n} NodeAddr={addr(n)} CPUs={os.cpu_count()} "
                          "RealMemory=200 State=UNKNOWN"
                          for n in ("cn1", "cn2", "qpu1", "qpu2"))
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(cluster=CLUSTER, subnet=SUBNET, munge=self.munge,
                                      dir=self.dir, nodes=nodes))

    def start_slurmctld(self):
        self._spawn("slurmctld", "ctl", ["slurmctld", "-D", "-i", "-f", self.conf])

        def ping():
            r = self.run("ctl", ["scontrol", "ping"], user=False, timeout=30)
            return r.returncode == 0 and "UP" in r.stdout
        if not wait_for(ping, 30, 0.5):
            raise RuntimeError("slurmctld did not answer: " + self.tail("slurmctld.log"))

    def node_states(self):
        r = self.run("ctl", ["sinfo", "-h", "-N", "-o", "%N %T"], user=False, timeout=30)
        return dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)

    def wait_idle(self, nodes):
        def idle():
            st = self.node_states()
            return all(st.get(n) in ("idle", "mixed", "allocated") for n in nodes)
        if not wait_for(idle, 60, 0.5):
            raise RuntimeError(f"nodes never became idle: {self.node_states()}" +
                               "".join(self.tail(f"slurmd-{n}.log") for n in nodes) +
                               self.tail("slurmctld.log"))

    def job_state(self, job_id):
        r = self.run("ctl", ["scontrol", "show", "job", str(job_id), "-o"], user=False,
                     timeout=30)
        for w in r.stdout.split():
            if w.startswith("JobState="):
                return w.split("=", 1)[1]
        return None

    def tail(self, name, n=30):
        path = os.path.join(self.dir, "log", name)
        try:
            with open(path, errors="replace") as f:
                return f"\n--- {name} ---\n" + "".join(f.readlines()[-n:])
        except OSError:
            return f"(no {name})"

    # ------------------------------------------------------------ stop

    def _stop_proc(self, p, timeout):
        if p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop(self):
        """Cancel every job, stop every process this cluster started (by
        PID), remove its namespaces (veths, bridge) and directory."""
        if self._stopped:
            return
        self._stopped = True
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run("ctl", ["scancel", "--full", "-u", "nobody"], user=False, timeout=30)
                wait_for(lambda: self.run("ctl", ["squeue", "-h"], user=False,
                                          timeout=30).stdout.strip() == "", 20, 0.5)
            except (subprocess.SubprocessError, OSError):
                pass
        order = [k for k in self.procs if k.startswith("slurmd-")] + ["slurmctld"] + \
            [k for k in self.procs if k.startswith("qrtd-")] + \
            [k for k in self.procs if k.startswith("qpu-sim-")] + \
            [k for k in self.procs if k.startswith("munged-")]
        for name in order:
            if name in self.procs:
                self._stop_proc(self.procs[name], 40 if name.startswith("qrtd") else 20)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in stepds_under(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for ns in reversed(self.made_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for top in sorted(slurm_lab.Lab._slurm_cgroups(self) - self.cgroups_before):
            for root, _, _ in sorted(os.walk(top), key=lambda t: -len(t[0])):
                try:
                    os.rmdir(root)
                except OSError:
                    pass
        if os.environ.get("QRT_SLURM_KEEP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
