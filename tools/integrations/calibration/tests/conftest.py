"""qpu-aer's drift model (tools/endpoints/qpu-aer/qpu_aer_drift.py) is
qpu-aer's, not this package's: the tests take it from the source tree."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "endpoints", "qpu-aer"))
