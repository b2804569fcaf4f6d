#!/usr/bin/env python3
"""A real qrtd with one QPU for the QDMI device library's tests.

`qrtd run` (no partition applied, dispatch untuned, as the invoking user)
drives QPU qpu0 on an endpoint: qpu-aer (OpenQASM 3 on qiskit-aer) when
QPU_AER names it, else qpu-sim (the mechanics: sessions, properties,
submit/check/wait/cancel, errors; its counts are pseudo-random).  qpu0's
calibration is pushed, so a test decides when the QPU is in a blackout
(no window in force) and when it is calibrated.  [qpu.device] states the
facts the library reports (qubits, basis gates, coupling map, durations,
max shots) when this qrtd knows the section.

QPU qpu1's endpoint is write-only (file:///dev/null): its jobs end `sent`,
with no result.  Where munge is installed, qrtd also listens on tcp://
(rpc.listen on 127.0.0.1, a munged of the lab's own and its key), as on a
QPU node that compute nodes reach.

As a command: `qdmi_lab.py PROGRAM ARGS...` starts the lab, runs PROGRAM
with QRTD_QDMI_SOCKET (the socket), QRTD_QDMI_URL (the tcp:// address, or
empty without munge) and QRT_MUNGE_SOCKET (the lab's munged),
QRTD_QDMI_ENDPOINT (aer|sim) and QRTD_QDMI_DEVICE (1 when the device facts
are served) in its environment, stops the lab and exits with PROGRAM's
status.

Only the processes this module started are signalled, by pid.
Environment: QRTD, QPU_SIM, optionally QPU_AER (a command line) and
QRT_PYTHON_DIR (tools/clients/python/src, for qrt_client).
"""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.environ.get("QRT_PYTHON_DIR",
                                  os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                               "../../../tools/clients/python/src")))
import qrt_client  # noqa: E402

NS = 1_000_000_000
QUBITS = 5
MAX_SHOTS = 100_000

CONFIG = """
[agent]
log_level = "info"
watchdog = false
# A private temporary directory: keep the invoking user (e2e runs the
# deployed way, as user qrtd).
user = "{user}"
[host]
apply_on_run = false
[dispatch]
mode = "untuned"
# A shared, unisolated test host (and qpu-aer's Python next to qrtd) can
# hold the hand-over up by seconds when loaded; these tests are about QDMI, not
# lateness, so a late job is still sent rather than missed.
miss_tolerance_ns = 10_000_000_000
[timeline]
policy = "edf-backfill"
horizon_ns = 600_000_000_000
default_lease_ns = 600_000_000_000
[rpc]
socket_path = "{dir}/qrtd.sock"
{listen}
[roles]
reader = []
scheduler = ["uid:{uid}"]
calibration = ["uid:{uid}"]
admin = []
[probes]
enabled = false

[[qpu]]
name = "qpu0"
endpoint = "unix://{dir}/qpu0.sock"
calibration = "pushed"
fidelity_f0 = 0.99
"""

DEVICE = """
[qpu.device]
qubits = {qubits}
technology = "superconducting"
basis_gates = ["rz", "sx", "x", "cx", "measure"]
coupling_map = [[0, 1], [1, 0], [1, 2], [2, 1], [2, 3], [3, 2], [3, 4], [4, 3]]
gate_durations_ns = {{ rz = 0, sx = 35, x = 35, cx = 300, measure = 1200 }}
max_shots = {max_shots}
"""

# A write-only QPU: what is sent there ends `sent`, and nothing comes back.
WRITE_ONLY = """
[[qpu]]
name = "qpu1"
endpoint = "file:///dev/null"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
"""


def wait_for(pred, timeout_s, step_s=0.05):
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def knows_device_section(qrtd):
    """Whether this qrtd accepts [qpu.device] (qrtd.toml(5) names it)."""
    man = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../agent/man/qrtd.toml.5")
    try:
        with open(man) as f:
            return "qpu.device" in f.read()
    except OSError:
        return False


class Lab:
    def __init__(self):
        self.qrtd = os.environ.get("QRTD", "")
        self.sim = os.environ.get("QPU_SIM", "")
        self.aer = os.environ.get("QPU_AER", "")
        if not self.qrtd or not (self.sim or self.aer):
            raise RuntimeError("QRTD and QPU_SIM (or QPU_AER) must name the programs")
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="qrt-qdmi-", dir=base)
        self.sock = os.path.join(self.dir, "qrtd.sock")
        self.why_sim = ""
        if self.aer and not os.access(shlex.split(self.aer)[0], os.X_OK):
            # The SDK venv (sdk.venv fixture) is not there: the mechanics only.
            self.why_sim = f"{shlex.split(self.aer)[0]} is missing (the SDK venv could not be made)"
            print(f"qdmi_lab: qpu-aer cannot run: {self.why_sim}; using qpu-sim", file=sys.stderr)
            self.aer = ""
        if not self.aer and not self.sim:
            raise RuntimeError("no endpoint: " + self.why_sim)
        self.endpoint = "aer" if self.aer else "sim"
        self.device = knows_device_section(self.qrtd)
        self.procs = []
        self.logs = []
        self.url = ""
        self.munge_sock = ""

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "qrtd.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def start(self):
        ep = f"unix://{self.dir}/qpu0.sock"
        if self.aer:
            args = shlex.split(self.aer) + ["--listen", ep, "--qubits", str(QUBITS),
                                            "--max-shots", str(MAX_SHOTS)]
        else:
            args = [self.sim, "--listen", ep, "--qubits", "2", "--duration-s", "300"]
        self.logs.append(open(os.path.join(self.dir, "endpoint.log"), "w"))
        self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.logs[-1]))
        if not wait_for(lambda: os.path.exists(f"{self.dir}/qpu0.sock") or self.procs[0].poll() is not None,
                        90) or self.procs[0].poll() is not None:
            with open(os.path.join(self.dir, "endpoint.log")) as f:
                raise RuntimeError(f"the endpoint ({self.endpoint}) did not listen:\n" + f.read()[-2000:])
        listen = self.start_munged()
        cfg = os.path.join(self.dir, "qrtd.toml")
        with open(cfg, "w") as f:
            import pwd
            text = CONFIG.format(dir=self.dir, uid=os.getuid(), user=pwd.getpwuid(os.getuid()).pw_name,
                                 listen=listen)
            if self.device:
                text += DEVICE.format(qubits=QUBITS, max_shots=MAX_SHOTS)
            f.write(text + WRITE_ONLY)
        state = os.path.join(self.dir, "state")
        os.mkdir(state, 0o750)
        self.logs.append(open(os.path.join(self.dir, "qrtd.log"), "w"))
        p = subprocess.Popen([self.qrtd, "run", "-c", cfg, "--state-dir", state],
                             stdout=self.logs[-1], stderr=subprocess.STDOUT)
        self.procs.append(p)

        def up():
            if p.poll() is not None:
                raise RuntimeError("qrtd exited:\n" + self.log_tail())
            try:
                qrt_client.Client(self.sock, timeout=5).close()
                return True
            except qrt_client.QrtError:
                return False
        if not wait_for(up, 30):
            raise RuntimeError("qrtd did not come up:\n" + self.log_tail())
        with self.client() as c:
            c.status()  # served: every start-up step is done

            def endpoint_up():
                return all(q.get("endpoint_up") for q in c.qpus())
            if not wait_for(endpoint_up, 60, 0.1):
                raise RuntimeError(f"qrtd never reached the endpoint ({self.endpoint}):\n" + self.log_tail())
        return self

    def start_munged(self):
        """qrtd's rpc.listen lines, with a munged of the lab's own (its key,
        its socket) when munge is installed; none otherwise."""
        path = "/usr/sbin:/usr/bin:/sbin:/bin"
        munged, mungekey = shutil.which("munged", path=path), shutil.which("mungekey", path=path)
        if not munged or not mungekey:
            return ""
        d = os.path.join(self.dir, "munge")
        os.mkdir(d, 0o755)
        key = os.path.join(d, "munge.key")
        subprocess.run([mungekey, "--create", "--keyfile=" + key], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.chmod(key, 0o400)
        sock = os.path.join(d, "munge.sock")
        self.procs.append(subprocess.Popen(
            [munged, "--foreground", "--force", "--socket=" + sock, "--key-file=" + key,
             "--pid-file=" + os.path.join(d, "munged.pid"), "--seed-file=" + os.path.join(d, "seed"),
             "--log-file=" + os.path.join(d, "munged.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not wait_for(lambda: os.path.exists(sock), 10):
            raise RuntimeError("munged did not create " + sock)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url, self.munge_sock = f"tcp://127.0.0.1:{port}", sock
        return f'listen = "{self.url}"\nmunge_socket = "{sock}"'

    def client(self):
        return qrt_client.Client(self.sock, timeout=30)

    def push(self, windows):
        """Replace qpu0's calibration: [(from_s, until_s, calibration_id)], seconds from now."""
        t = time.time_ns()
        ws = [{"calibration_id": cid, "valid_from_ns": t + int(a * NS), "valid_until_ns": t + int(b * NS),
               "f0": 0.99, "tau_ns": 3600 * NS} for a, b, cid in windows]
        with self.client() as c:
            return c.calibration_update("qpu0", ws)

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []
        for f in self.logs:
            f.close()
        self.logs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def env(self):
        e = dict(os.environ)
        e.update({"QRTD_QDMI_SOCKET": self.sock, "QRTD_QDMI_URL": self.url,
                  "QRT_MUNGE_SOCKET": self.munge_sock, "QRTD_QDMI_ENDPOINT": self.endpoint,
                  "QRTD_QDMI_WHY_SIM": self.why_sim,
                  "QRTD_QDMI_DEVICE": "1" if self.device else "0"})
        return e


def main(argv):
    if len(argv) < 2:
        print("usage: qdmi_lab.py PROGRAM [ARGS...]", file=sys.stderr)
        return 64
    lab = Lab()
    try:
        try:
            lab.start()
        except RuntimeError as e:
            print(f"qdmi_lab: {e}", file=sys.stderr)
            return 1
        return subprocess.run(argv[1:], env=lab.env()).returncode
    finally:
        lab.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
