#!/usr/bin/env python3
"""The scripts root runs, checked offline.

demo.sh (issue 24 item 5): it hands /run/qrtd-demo to user qrtd, and it
used to chgrp and chmod $run_dir/qpu0.sock there afterwards, as root,
following whatever symlink a compromised daemon planted.  Root now changes
no owner or mode in a directory another user can write: qpu-sim sets its
socket's group and mode itself, in a directory only root writes.
"""

import os
import re
import unittest

SRC = os.environ.get("QRT_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
QUICKSTART = os.path.join(SRC, "tools", "quickstart")
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



if __name__ == "__main__":
    unittest.main()
