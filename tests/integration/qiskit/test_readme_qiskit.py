#!/usr/bin/env python3
"""README.md "From Qiskit", pasted by an ordinary user, runs to its counts.

The block is read from README.md itself (the first ```sh block of the
section), so this test follows the README: if the text changes, the test
runs the new text.  It runs with bash, the shell a user pastes it into,
as user nobody (uid 65534, its own group only, no capabilities), from a directory whose tools/, config/ and
build/ are this source tree's and this build tree's, as after
`tools/dev/build.sh` in a checkout.  What the README promises:

  - nothing but the block is needed: qpu-aer, `qrtd run` and the Qiskit
    program start as that user (the state directory the block names under
    its own mktemp directory is created; the socket is not given to a group
    the user cannot use);
  - the program prints the Bell pair's counts, only '00' and '11', summing
    to the 1000 shots, then the calibration id and the arrival lateness.

When the block fails or does not end within BLOCK_TIMEOUT_S, the test
names the block's line its shell ran last (bash's xtrace, kept apart from
the output) and the block's processes still running.  The venv must run
as nobody when started by nobody's shell (the fixture makes it from
Debian's interpreter, not from one under /root); the test skips, naming
why, when it does not.

The block's processes are in the process group of the shell this test
starts; whatever is left of them when it ends is signalled by that group
id, and the block's /tmp/qrt-sdk.* directory is removed.  Skips (77),
naming why, when not root (it cannot become nobody), without user nobody
or setpriv.  Environment: QRT_SOURCE_DIR, QRT_BUILD_DIR.
"""

import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SOURCE = os.environ.get("QRT_SOURCE_DIR", "")
BUILD = os.environ.get("QRT_BUILD_DIR", "")
NOBODY = "nobody"


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def readme_block():
    """The first ```sh block of README.md's "## From Qiskit"."""
    with open(os.path.join(SOURCE, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## From Qiskit\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, 'README.md has no "## From Qiskit" section'
    block = re.search(r"^```sh\n(.*?)^```$", m.group(1), re.S | re.M)
    assert block, 'README.md "From Qiskit" has no ```sh block'
    return block.group(1)


# How long the block may take: creating nothing (the venv is the fixture's),
# starting qpu-aer and qrtd, one job in the next calibration window (the
# block's QPU calibrates for 5 s of every minute).
BLOCK_TIMEOUT_S = 300


def last_traced(trace, block):
    """The block's line the shell ran last (its xtrace), as README.md has it."""
    trace.flush()
    trace.seek(0)
    last = None
    for line in trace:
        m = re.match(r"^\++ \[line (\d+)\] ", line)
        if m:
            last = int(m.group(1))
    lines = block.splitlines()
    if last is None or not 1 <= last <= len(lines):
        return "the block ran no command (see its output above)"
    return f"the block was at its line {last}: {lines[last - 1].strip()}"


def still_running(sid):
    """The block's processes still running (its session), one a line."""
    ps = subprocess.run(["ps", "-o", "pid=,etime=,args=", "-s", str(sid)], stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True).stdout
    return "".join(f"\n  still running: {p.strip()[:160]}" for p in ps.splitlines() if p.strip())


def main():
    if not SOURCE or not BUILD:
        skip("QRT_SOURCE_DIR and QRT_BUILD_DIR must name the trees")
    if os.geteuid() != 0:
        skip("runs the block as user nobody, which only root can become")
    try:
        user = pwd.getpwnam(NOBODY)
    except KeyError:
        skip(f"no user {NOBODY}")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        skip("setpriv (util-linux) is missing")
    block = readme_block()
    print("the block, from README.md:\n" + block, flush=True)
    as_nobody = [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                 "--inh-caps=-all", "--"]
    venv_python = os.path.join(BUILD, "venv", "bin", "python")
    # Started by a shell of that user, as the block starts it: setpriv's own
    # exec still resolves the path with root's search rights (it ran a venv
    # whose interpreter sits under /root, 0700, that the block then could
    # not start).
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    if subprocess.run(as_nobody + ["bash", "-c", 'exec "$0" -c "import qrtd_qiskit"', venv_python], env=env,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        # A venv made from an interpreter under a private directory (pyenv in
        # /root) serves its maker only; the block's own sdk_venv.sh step
        # could not make another in this build tree as nobody.
        skip(f"{venv_python} does not run as {NOBODY} (it is {os.path.realpath(venv_python)}): make the venv "
             "from an interpreter every user can run, e.g. rm -r build/venv; "
             "QRT_PYTHON=/usr/bin/python3 tools/integrations/qiskit/sdk_venv.sh build")

    # A checkout as the user has it: tools/ and config/ of this source tree,
    # build/ this build tree (which need not be SOURCE/build).
    farm = tempfile.mkdtemp(prefix="qrt-readme-")
    os.chmod(farm, 0o755)
    for name, target in (("tools", os.path.join(SOURCE, "tools")), ("config", os.path.join(SOURCE, "config")),
                         ("build", BUILD)):
        os.symlink(target, os.path.join(farm, name))
    before = set(glob.glob("/tmp/qrt-sdk.*"))
    # The shell traces each command it runs, with the block's line, to a
    # file of its own (not the output the test reads): when the block fails
    # or hangs, the last traced line is what it was waiting for.  Set on the
    # block's first line, so that the lines count as in README.md.
    trace = open(os.path.join(farm, "trace"), "w+")
    cmd = as_nobody + ["bash", "-c", f"PS4='+ [line $LINENO] '; BASH_XTRACEFD={trace.fileno()}; set -x; " + block]
    shell = subprocess.Popen(cmd, cwd=farm, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, pass_fds=(trace.fileno(),))
    waited, status = "", None
    try:
        out, _ = shell.communicate(timeout=BLOCK_TIMEOUT_S)
        status = shell.returncode
    except subprocess.TimeoutExpired:
        # What the block was doing, and what of it was still running.
        waited = last_traced(trace, block) + still_running(shell.pid)
        # The whole group: its background processes hold the output open.
        os.killpg(shell.pid, signal.SIGKILL)
        out, _ = shell.communicate()
        status = f"killed after {BLOCK_TIMEOUT_S} s"
    finally:
        # What the block started and did not stop: its process group.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(shell.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(2)
        made = set(glob.glob("/tmp/qrt-sdk.*")) - before
        logs = ""
        for d in sorted(made):
            log = os.path.join(d, "qrtd.log")
            if os.path.exists(log):
                with open(log, errors="replace") as f:
                    logs += f"\n{log}:\n" + "".join(f.readlines()[-20:])
            if os.stat(d).st_uid == user.pw_uid:
                shutil.rmtree(d, ignore_errors=True)
        if not waited and status != 0:
            waited = last_traced(trace, block)
        trace.close()
        shutil.rmtree(farm, ignore_errors=True)
    text = out.decode(errors="replace")
    print(f"the block as {NOBODY} (exit status {status}):\n{text}{logs}", flush=True)
    if waited:
        print(waited, flush=True)

    counts = re.search(r"^\{'(\d\d)': (\d+)(?:, '(\d\d)': (\d+))?\}$", text, re.M)
    if counts is None:
        print(f"FAIL: the block as {NOBODY} printed no counts" + (f" ({waited.splitlines()[0]})" if waited else ""))
        return 1
    got = {counts.group(1): int(counts.group(2))}
    if counts.group(3):
        got[counts.group(3)] = int(counts.group(4))
    if not set(got) <= {"00", "11"} or sum(got.values()) != 1000:
        print(f"FAIL: the counts {got} are not a Bell pair's 1000 shots")
        return 1
    after = text[counts.end():].strip().splitlines()
    if not after or not re.fullmatch(r"\d+ -?\d+", after[0].strip()):
        print("FAIL: no calibration id and arrival lateness after the counts")
        return 1
    print(f"ok: {got}; calibration id and lateness {after[0].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
