#!/usr/bin/env python3
"""ruff and mypy over every Python distribution and script in tools/ (ctest
python.lint); 0 findings is the bar.

    build/venv-lint/bin/python tools/dev/python_lint.py [--tree DIR]
    build/venv-lint/bin/python tools/dev/python_lint.py --self-test

Run with the interpreter of the lint venv (tools/dev/lint_venv.sh makes it):
the checkers are the ones tools/dev/requirements-lint.txt pins.

What it finds, under DIR (default: the tools/ beside this file):
  - a distribution: a folder with a pyproject.toml.  ruff checks every
    Python file in it with the distribution's own [tool.ruff]; mypy checks
    what its [tool.mypy] `files` names (else its src/), with that table as
    the configuration.
  - a script: a Python file (*.py, or a "#!...python" first line) in no
    distribution.  ruff checks it with tools/ruff.toml, mypy with
    tools/mypy.ini.
Every distribution's src/ is on mypy's path, so `import qrt_client`
resolves to the source tree wherever it is imported.

Exit 0 without findings; 1 with any, each printed as file:line: message
(the file relative to DIR) under its distribution or the scripts; 2 when a
checker could not run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parent
# Folders that hold no source of ours: build trees, virtual environments,
# caches.
SKIP_DIRS = {"__pycache__", ".git", "build", "dist", "node_modules", ".mypy_cache", ".ruff_cache",
             ".pytest_cache", ".venv"}


def skipped(d: Path) -> bool:
    return d.name in SKIP_DIRS or d.name.startswith("venv") or d.name.endswith(".egg-info")


def is_python(path: Path) -> bool:
    if path.suffix == ".py":
        return True
    if path.suffix or not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            first = f.readline(128)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


@dataclass
class Unit:
    """A distribution (dist set) or the scripts of the tree (dist None)."""

    name: str
    root: Path
    files: list[Path] = field(default_factory=list)
    dist: Path | None = None
    findings: dict[str, list[str]] = field(default_factory=dict)


def discover(tree: Path) -> tuple[list[Unit], Unit]:
    dists: list[Path] = []
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(tree):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not skipped(d / n))
        if "pyproject.toml" in filenames:
            dists.append(d)
        files.extend(d / n for n in sorted(filenames) if is_python(d / n))
    units = [Unit(name=str(d.relative_to(tree)), root=d, dist=d) for d in sorted(dists)]
    scripts = Unit(name="scripts", root=tree)
    for f in files:
        owners = [u for u in units if u.root in f.parents]
        # The innermost distribution owns the file.
        owner = max(owners, key=lambda u: len(u.root.parts)) if owners else scripts
        owner.files.append(f)
    return units, scripts


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def ruff(unit: Unit, tree: Path, env: dict[str, str]) -> list[str]:
    if not unit.files:
        return []
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "--quiet"]
    if unit.dist is None:
        cmd += ["--config", str(tree / "ruff.toml")]
    p = run([*cmd, *map(str, unit.files)], tree, env)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"ruff failed on {unit.name} (exit {p.returncode}): {p.stderr.strip()}")
    return [line for line in p.stdout.splitlines() if line.strip() and not line.startswith("Found ")]


def mypy_files(unit: Unit) -> list[str]:
    if unit.dist is None:
        return [str(f) for f in unit.files]
    with (unit.dist / "pyproject.toml").open("rb") as f:
        conf = tomllib.load(f).get("tool", {}).get("mypy", {})
    named = conf.get("files")
    if isinstance(named, str):
        named = [s.strip() for s in named.split(",")]
    if named:
        return [str(unit.dist / n) for n in named]
    if (unit.dist / "src").is_dir():
        return [str(unit.dist / "src")]
    return [str(f) for f in unit.files]


def mypy(unit: Unit, tree: Path, srcs: list[Path], env: dict[str, str], cache: Path) -> list[str]:
    if not unit.files:
        return []
    if unit.dist is None:
        config = tree / "mypy.ini"
        path = srcs
    else:
        config = unit.dist / "pyproject.toml"
        # Its own src/ comes from the files given; the others' from the path.
        path = [s for s in srcs if s.parent != unit.dist]
    menv = dict(env, MYPYPATH=os.pathsep.join(map(str, path)))
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(cache / unit.name),
           "--no-error-summary", "--no-pretty", "--hide-error-context", "--show-error-codes", "--scripts-are-modules"]
    p = run([*cmd, *mypy_files(unit)], tree, menv)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"mypy failed on {unit.name} (exit {p.returncode}): {(p.stderr or p.stdout).strip()}")
    # A module another unit owns (found on the path) is that unit's to report.
    own = {f.resolve() for f in unit.files}
    return [line for line in p.stdout.splitlines()
            if ": error:" in line and (tree / line.split(":", 1)[0]).resolve() in own]


def lint(tree: Path, out: list[str]) -> int:
    units, scripts = discover(tree)
    srcs = [u.dist / "src" for u in units if u.dist is not None and (u.dist / "src").is_dir()]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    total = 0
    with tempfile.TemporaryDirectory(prefix="qrt-python-lint-") as cache:
        for unit in [*units, scripts]:
            unit.findings["ruff"] = ruff(unit, tree, env)
            unit.findings["mypy"] = mypy(unit, tree, srcs, env, Path(cache))
    width = max(len(u.name) for u in [*units, scripts])
    for unit in [*units, scripts]:
        n_ruff, n_mypy = len(unit.findings["ruff"]), len(unit.findings["mypy"])
        total += n_ruff + n_mypy
        out.append(f"{unit.name:<{width}}  {len(unit.files):3d} files  ruff {n_ruff:3d}  mypy {n_mypy:3d}")
        for checker in ("ruff", "mypy"):
            out.extend(f"    {checker}: {line}" for line in unit.findings[checker])
    out.append(f"{total} finding(s) in {len(units)} distribution(s) and {len(scripts.files)} script(s) under {tree}")
    return 1 if total else 0


def self_test() -> int:
    """A planted finding of each kind, in a distribution and in a script, is
    reported with its file and line; the same tree without them is clean."""
    with tempfile.TemporaryDirectory(prefix="qrt-python-lint-test-") as d:
        tree = Path(d)
        shutil.copy(TOOLS / "ruff.toml", tree / "ruff.toml")
        shutil.copy(TOOLS / "mypy.ini", tree / "mypy.ini")
        dist = tree / "pkg-dist"
        (dist / "src" / "pkg").mkdir(parents=True)
        (dist / "pyproject.toml").write_text('[project]\nname = "pkg"\nversion = "0"\n\n'
                                             '[tool.ruff]\nline-length = 110\n\n[tool.mypy]\nstrict = true\n')
        module = dist / "src" / "pkg" / "__init__.py"
        script = tree / "tool"
        clean_module = '"""pkg."""\n\n\ndef twice(x: int) -> int:\n    return 2 * x\n'
        clean_script = '#!/usr/bin/env python3\n"""A script."""\nfrom pkg import twice\n\nprint(twice(2))\n'
        module.write_text(clean_module)
        script.write_text(clean_script)
        script.chmod(0o755)
        out: list[str] = []
        if lint(tree, out) != 0:
            print("\n".join(out))
            print("FAIL: the clean tree has findings")
            return 1
        module.write_text(clean_module.replace('"""pkg."""\n', '"""pkg."""\nimport os\n'))
        script.write_text(clean_script.replace("twice(2)", 'twice("2")'))
        out = []
        status = lint(tree, out)
        text = "\n".join(out)
        want = ["ruff: pkg-dist/src/pkg/__init__.py:2:8: F401", 'mypy: tool:5: error: Argument 1 to "twice"']
        missing = [w for w in want if w not in text]
        if status != 1 or missing:
            print(text)
            print(f"FAIL: exit {status} (want 1); not reported: {missing}")
            return 1
        print(text)
        print("ok: the planted findings are reported with their file and line, and fail the check")
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=TOOLS, help="the folder to check (default: tools/)")
    ap.add_argument("--self-test", action="store_true", help="show that a planted finding fails the check")
    args = ap.parse_args()
    try:
        if args.self_test:
            return self_test()
        out: list[str] = []
        status = lint(args.tree.resolve(), out)
    except RuntimeError as e:
        print(f"python_lint: {e}", file=sys.stderr)
        return 2
    print("\n".join(out))
    return status


if __name__ == "__main__":
    sys.exit(main())
