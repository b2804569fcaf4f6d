#!/usr/bin/env python3
"""Fails when README.md or a folder's README.md names a path of the
repository that does not exist: the design of record sends its reader to
files, and a move that leaves a README behind sends them nowhere.

    readme_paths.py SOURCE_DIR      check every tracked README.md
    readme_paths.py --self-test     prove that it refuses a missing path

What counts as a path: a backquoted word (outside fenced code blocks) with
no spaces or URL, which starts with something the repository has:
  - a top-level entry (`agent/...`, `tools/dev/build.sh`, `README.md`);
  - an entry of the README's own folder (`src/x.cpp` in bpf/README.md);
  - an include path (`qrt/...`, `qrt_bpf/...`, `rtcore/x.hpp`), found under
    agent/include, agent/proto/include, bpf/include, rtcore/include or
    tools/clients/c/include;
  - a folder of agent/src (`rpc/server.cpp`, `timeline/durability.hpp`),
    found under agent/src or agent/include/qrt.
Such a word must name a tracked file or a folder holding one.  A bare file
name of source (`framing.cpp`, `wire.h`, `demo.sh`) must be the name of a
tracked file somewhere, unless the build writes it (BUILT).  Anything else
(a unit name, a Go import path, a build output) is not checked.
Exit 0: every path exists; 1: each missing one printed as README:line: path.
"""

import os
import re
import subprocess
import sys
import tempfile

SOURCE = re.compile(r"\.(c|cc|cpp|h|hpp|py|go|sh|cmake)$")
# File names the build writes, never tracked (bpf/CMakeLists.txt).
BUILT = {"vmlinux.h"}
INCLUDE_ROOTS = ["agent/include", "agent/proto/include", "bpf/include", "rtcore/include",
                 "tools/clients/c/include"]


def tracked_files(root):
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True).stdout
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for d, subdirs, names in os.walk(root):
            subdirs[:] = [s for s in subdirs if s != ".git" and not s.startswith("build")]
            found += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return found


def words(text):
    """(line, word) for every backquoted word outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            continue  # code: commands, not references
        for m in re.finditer(r"`([^`\s]+)`", line):
            yield n, m.group(1)


def check(root):
    files = tracked_files(root)
    exists = set(files)
    for f in files:
        while "/" in f:
            f = f.rsplit("/", 1)[0]
            exists.add(f)
    top = {f.split("/", 1)[0] for f in files}
    names = {os.path.basename(f) for f in files}
    src_folders = {f.split("/")[2] for f in files if f.startswith("agent/src/") and f.count("/") >= 3}
    readmes = sorted(f for f in files if os.path.basename(f) == "README.md")
    missing = []
    for readme in readmes:
        here = os.path.dirname(readme)
        local = {os.path.relpath(f, here).split("/", 1)[0] for f in files if here and f.startswith(here + "/")}
        with open(os.path.join(root, readme), encoding="utf-8") as fh:
            text = fh.read()
        for line, word in words(text):
            if "://" in word or word.startswith(("/", "~", "$", "-", ".")) or re.search(r"[*<>{}=|()\[\]@,:;'\"]", word):
                continue
            path = word.rstrip("/")
            first = path.split("/", 1)[0]
            candidates = []
            if first in top and ("/" in path or path in exists):
                candidates.append(path)
            if here and first in local:
                candidates.append(os.path.normpath(os.path.join(here, path)))
            if first in ("qrt", "qrt_bpf") and "/" in path:
                candidates += [os.path.join(r, path) for r in INCLUDE_ROOTS]
            if first == "rtcore" and "/" in path:
                candidates.append(os.path.join("rtcore/include", path))
            if first in src_folders and "/" in path:
                candidates += [os.path.join("agent/src", path), os.path.join("agent/include/qrt", path)]
            if candidates and not any(c in exists for c in candidates):
                missing.append(f"{readme}:{line}: {word}")
            elif not candidates and "/" not in path and SOURCE.search(path) and path not in names | BUILT:
                missing.append(f"{readme}:{line}: {word}")
    if missing:
        print("\n".join(missing))
        print(f"readme_paths: {len(missing)} path(s) above do not exist: point them at the file's "
              "place now, or say it without a path", file=sys.stderr)
        return 1
    print(f"readme_paths: {len(readmes)} README.md files, every path they name exists")
    return 0


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "agent/src/rpc"))
        os.makedirs(os.path.join(tmp, "agent/include/qrt/rpc"))
        for f in ["agent/src/rpc/server.cpp", "agent/include/qrt/rpc/server.hpp"]:
            open(os.path.join(tmp, f), "w").close()
        with open(os.path.join(tmp, "README.md"), "w") as fh:
            fh.write("The server (`agent/src/rpc/server.cpp`, `qrt/rpc/server.hpp`,\n"
                     "`rpc/server.cpp`) and `qrtd.service`, `k8s.io/api`.\n"
                     "The listener is `agent/src/rpc/listener.cpp`.\n")
        with open(os.path.join(tmp, "agent/src/rpc/README.md"), "w") as fh:
            fh.write("`server.cpp` and `missing/x.cpp`, `rpc/gone.hpp`\n`framing.cpp`\n")
        out = subprocess.run([sys.executable, __file__, tmp], capture_output=True, text=True)
        want = ["README.md:3: agent/src/rpc/listener.cpp", "agent/src/rpc/README.md:1: rpc/gone.hpp",
                "agent/src/rpc/README.md:2: framing.cpp"]
        if out.returncode != 1 or any(w not in out.stdout for w in want):
            print(f"self-test: expected a refusal naming {want}, got {out.returncode}: {out.stdout}{out.stderr}",
                  file=sys.stderr)
            return 1
        if len(out.stdout.strip().split("\n")) != len(want):
            print(f"self-test: refused more than the missing paths: {out.stdout}", file=sys.stderr)
            return 1
        print("self-test: refused, naming " + " and ".join(want))
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} SOURCE_DIR | --self-test", file=sys.stderr)
        sys.exit(2)
    sys.exit(self_test() if sys.argv[1] == "--self-test" else check(sys.argv[1]))
