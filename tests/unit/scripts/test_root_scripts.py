#!/usr/bin/env python3
"""The scripts root runs, checked offline.

demo.sh: it hands /run/qrtd-demo to user qrtd, and it
used to chgrp and chmod $run_dir/qpu0.sock there afterwards, as root,
following whatever symlink a compromised daemon planted.  Root now changes
no owner or mode in a directory another user can write: qpu-sim sets its
socket's group and mode itself, in a directory only root writes.

deps.sh: it left prometheus (every interface, :9090),
slurmctld, slurmd and munge enabled at boot, although only the tests use
them and the tests run their own daemons.  It now installs them with starts
held back and keeps them disabled and stopped, on every run; a package that
was there before deps.sh is only named.  Run against stubs: nothing is
installed or changed on this host.
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

SRC = os.environ.get("QRT_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
QUICKSTART = os.path.join(SRC, "tools", "dev")
OWNER_CHANGES = re.compile(r"(^|[;&|(]\s*|\s)(chmod|chgrp|chown|setfacl)\s")


def read(path):
    with open(path) as f:
        return f.read()


def script_lines(path):
    """The script's command lines, comments and heredoc bodies left out."""
    out = []
    heredoc = None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if heredoc is not None:
                if line.strip() == heredoc:
                    heredoc = None
                continue
            m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
            if m:
                heredoc = m.group(1)
            code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
            if code.strip():
                out.append((n, code.rstrip("\n")))
    return out


def variables(lines):
    """name -> value of the plain assignments (NAME=value, ${X:-value} taken as value)."""
    out = {}
    for _, code in lines:
        m = re.match(r"\s*([A-Za-z_]\w*)=(\S+)\s*$", code)
        if m:
            v = m.group(2).strip("\"'")
            d = re.match(r"\$\{\w+:-(.*)\}$", v)
            out[m.group(1)] = d.group(1) if d else v
    return out


def handed_to_others(lines):
    """The directories `install -d -o USER` gives to a user other than root, as written."""
    out = []
    for _, code in lines:
        m = re.search(r"\binstall\s+(.*)", code)
        if not m or " -d" not in " " + m.group(1):
            continue
        words = m.group(1).split()
        owner = words[words.index("-o") + 1] if "-o" in words else "root"
        if owner != "root":
            out += [w.strip("\"'") for w in words if w.strip("\"'").startswith(("$", "/"))]
    return out


class DemoScript(unittest.TestCase):
    def setUp(self):
        self.path = os.path.join(QUICKSTART, "demo.sh")
        self.lines = script_lines(self.path)
        self.vars = variables(self.lines)

    def expand(self, word):
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.vars.get(m.group(1), m.group(0)), word)

    def test_root_changes_no_owner_or_mode_in_a_directory_another_user_can_write(self):
        others = handed_to_others(self.lines)
        self.assertTrue(others, "demo.sh no longer hands its run directory to qrtd? update this test")
        dirs = {self.expand(d) for d in others}
        for n, code in self.lines:
            if not OWNER_CHANGES.search(code):
                continue
            for word in code.split():
                path = self.expand(word.strip("\"'"))
                for d in dirs:
                    self.assertFalse(path == d or path.startswith(d + "/"),
                                     f"demo.sh line {n}: `{code.strip()}` changes the owner or mode of "
                                     f"{path}, in {d}, a directory the daemon's user can write")

    def test_qpu_sim_makes_its_socket_for_group_qrt_in_a_directory_only_root_writes(self):
        sim = [code for _, code in self.lines if '"$sim"' in code and "--listen" in code]
        self.assertEqual(len(sim), 1, "one qpu-sim start in demo.sh")
        self.assertIn("--socket-group qrt", sim[0])
        self.assertIn("--socket-mode 0660", sim[0])
        listen = re.search(r'--listen\s+"unix://([^"]+)"', sim[0]).group(1)
        sock_dir = self.expand(os.path.dirname(listen))
        handed = {self.expand(d) for d in handed_to_others(self.lines)}
        self.assertNotIn(sock_dir, handed, "qpu-sim's socket is in a directory the daemon's user owns")
        made = [code for _, code in self.lines
                if re.search(r"\binstall\s+-d\b", code) and self.expand(code.split()[-1].strip("\"'")) == sock_dir]
        self.assertEqual(len(made), 1, f"demo.sh makes {sock_dir} itself")
        self.assertIn("-o root", made[0])
        # The demo profile names that socket.
        self.assertIn(f'endpoint = "unix://{self.expand(listen)}"', read(os.path.join(SRC, "config", "demo.toml")))


STUBS = {
    # Installed: every package in $STUB/installed.
    "dpkg-query": """#!/bin/sh
for p; do :; done
grep -qx "$p" "$STUB/installed" && echo "install ok installed" || exit 1
""",
    "apt-get": """#!/bin/sh
echo "apt-get $*" >> "$STUB/log"
[ "$1" = install ] || exit 0
shift
for p; do
  case "$p" in -*) ;; *)
    if [ -e "$QRT_DEPS_POLICY_RC" ]; then echo "$p held" >> "$STUB/log"; fi
    echo "$p" >> "$STUB/installed"
    # As Debian's postinst does: the unit enabled (and started unless held).
    case "$p" in prometheus|slurmctld|slurmd|munge)
      touch "$STUB/enabled.$p.service"
      [ -e "$QRT_DEPS_POLICY_RC" ] || touch "$STUB/active.$p.service";;
    esac;;
  esac
done
""",
    "systemctl": """#!/bin/sh
echo "systemctl $*" >> "$STUB/log"
for u; do :; done
case "$1" in
  is-enabled) [ -e "$STUB/enabled.$u" ];;
  is-active) [ -e "$STUB/active.$u" ];;
  disable) rm -f "$STUB/enabled.$u";;
  stop) rm -f "$STUB/active.$u";;
esac
""",
    "id": "#!/bin/sh\necho 0\n",
}

TEST_SERVICES = ["prometheus", "slurmctld", "slurmd", "munge"]


class DepsScript(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="qrt-deps-")
        self.stub = os.path.join(self.dir, "stub")
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.stub)
        os.mkdir(self.bin)
        for name, text in STUBS.items():
            p = os.path.join(self.bin, name)
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, 0o755)
        self.env = dict(os.environ, PATH=self.bin + ":" + os.environ["PATH"], STUB=self.stub,
                        QRT_DEPS_STATE_DIR=os.path.join(self.dir, "state"),
                        QRT_DEPS_POLICY_RC=os.path.join(self.dir, "policy-rc.d"))
        self.packages = self.all_packages()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def all_packages(self):
        text = read(os.path.join(QUICKSTART, "deps.sh"))
        body = re.search(r"QRT_PACKAGES=\((.*?)\n\)", text, re.S).group(1)
        return [w for line in body.splitlines() for w in line.split("#", 1)[0].split()]

    def have(self, packages):
        with open(os.path.join(self.stub, "installed"), "a") as f:
            f.write("".join(p + "\n" for p in packages))

    def deps(self):
        r = subprocess.run(["bash", os.path.join(QUICKSTART, "deps.sh")], env=self.env,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def state(self, kind, pkg):
        return os.path.exists(os.path.join(self.stub, f"{kind}.{pkg}.service"))

    def log(self):
        p = os.path.join(self.stub, "log")
        return read(p) if os.path.exists(p) else ""

    def test_the_test_only_daemons_are_installed_held_and_left_disabled_at_boot(self):
        self.have(p for p in self.packages if p not in TEST_SERVICES)
        out = self.deps()
        log = self.log()
        for p in TEST_SERVICES:
            self.assertIn(f"{p} held", log, f"{p} was installed with its start allowed")
            self.assertFalse(self.state("enabled", p), f"{p}.service left enabled at boot:\n{out}")
            self.assertFalse(self.state("active", p), f"{p}.service left running:\n{out}")
        self.assertFalse(os.path.exists(self.env["QRT_DEPS_POLICY_RC"]), "policy-rc.d left behind")

    def test_a_rerun_keeps_them_disabled_and_stopped(self):
        self.have(p for p in self.packages if p not in TEST_SERVICES)
        self.deps()
        # Enabled and started again since (a package upgrade, an admin).
        for p in TEST_SERVICES:
            open(os.path.join(self.stub, f"enabled.{p}.service"), "w").close()
            open(os.path.join(self.stub, f"active.{p}.service"), "w").close()
        os.remove(os.path.join(self.stub, "log"))
        out = self.deps()
        self.assertIn("already installed", out)
        self.assertNotIn("apt-get install", self.log())
        for p in TEST_SERVICES:
            self.assertFalse(self.state("enabled", p), f"{p}.service enabled after a rerun:\n{out}")
            self.assertFalse(self.state("active", p), f"{p}.service running after a rerun:\n{out}")
        out = self.deps()
        self.assertNotIn("disabled", out, "a third run still found something to do")

    def test_a_daemon_installed_before_deps_is_named_never_touched(self):
        self.have(self.packages)  # a Slurm node: everything already there
        for p in ("slurmd", "munge"):
            open(os.path.join(self.stub, f"enabled.{p}.service"), "w").close()
            open(os.path.join(self.stub, f"active.{p}.service"), "w").close()
        out = self.deps()
        for p in ("slurmd", "munge"):
            self.assertTrue(self.state("enabled", p))
            self.assertTrue(self.state("active", p))
            self.assertIn(f"note: {p}.service is enabled at boot; deps.sh did not install {p}", out)
        self.assertNotIn("systemctl disable", self.log())
        self.assertNotIn("systemctl stop", self.log())


if __name__ == "__main__":
    unittest.main()
