#!/usr/bin/env python3
"""README.md "From Qiskit", pasted by an ordinary user, runs to its counts.

The block is read from README.md itself (the first ```sh block of the
section), so this test follows the README: if the text changes, the test
runs the new text.  It runs with bash, the shell a user pastes it into
(its `kill %1 %2` needs a shell that keeps jobs, which dash without job
control does not), as user nobody (uid 65534, its own
group only, no capabilities), from a directory whose tools/, config/ and
build/ are this source tree's and this build tree's, as after
`tools/dev/build.sh` in a checkout.  What the README promises:

  - nothing but the block is needed: qpu-aer, `qrtd run` and the Qiskit
    program start as that user (the state directory the block names under
    its own mktemp directory is created; the socket is not given to a group
    the user cannot use);
  - the program prints the Bell pair's counts, only '00' and '11', summing
    to the 1000 shots, then the calibration id and the arrival lateness.

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
    if subprocess.run(as_nobody + [venv_python, "-c", "import qrtd_qiskit"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
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
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = as_nobody + ["bash", "-c", block]
    shell = subprocess.Popen(cmd, cwd=farm, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        out, _ = shell.communicate(timeout=300)
        status = shell.returncode
    except subprocess.TimeoutExpired:
        # The whole group: its background processes hold the output open.
        os.killpg(shell.pid, signal.SIGKILL)
        out, _ = shell.communicate()
        status = "killed after 300 s"
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
        shutil.rmtree(farm, ignore_errors=True)
    text = out.decode(errors="replace")
    print(f"the block as {NOBODY} (exit status {status}):\n{text}{logs}", flush=True)

    counts = re.search(r"^\{'(\d\d)': (\d+)(?:, '(\d\d)': (\d+))?\}$", text, re.M)
    if counts is None:
        print(f"FAIL: the block as {NOBODY} printed no counts")
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
