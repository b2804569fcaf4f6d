#!/usr/bin/env python3
"""qpu-aer: a QPU endpoint for qrtd that executes OpenQASM 3 on qiskit-aer
(the package qpu_aer, on the endpoint framework qrt_endpoint; see
qpu-aer(1)).

This file is the command: it runs qpu_aer.main with the interpreter it is
started with (one that has the pinned SDKs of requirements-sdk.txt), from
the packages beside it -- in the source tree tools/endpoints/qpu-aer/src,
tools/endpoints/qrt-endpoint/src and tools/clients/python/src; installed
(as /usr/bin/qpu-aer) /usr/share/qrtd/python/{qpu-aer,qrt-endpoint,
qrt-client}/src -- ahead of any other copy on the path.  A venv that has
the distributions pip-installed has its own qpu-aer command.
"""

import os
import sys


def _package_dirs():
    here = os.path.dirname(os.path.realpath(__file__))
    tree = [os.path.join(here, "src"), os.path.join(here, "..", "qrt-endpoint", "src"),
            os.path.join(here, "..", "..", "clients", "python", "src")]
    share = os.path.join(here, "..", "share", "qrtd", "python")
    installed = [os.path.join(share, d, "src") for d in ("qpu-aer", "qrt-endpoint", "qrt-client")]
    for dirs in (tree, installed):
        if all(os.path.isdir(d) for d in dirs):
            return [os.path.normpath(d) for d in dirs]
    return []


sys.path[:0] = _package_dirs()

from qpu_aer.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
