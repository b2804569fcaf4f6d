"""qrtd_qiskit: a Qiskit backend that runs circuits in a QPU's calibration
window, booked through qrtd (the QPU host agent).

    from qiskit import QuantumCircuit
    from qrtd_qiskit import QrtdBackend

    backend = QrtdBackend(qpu="qpu0")          # $QRT_SOCKET or /run/qrtd/qrtd.sock
    qc = QuantumCircuit(2, 2)
    qc.h(0); qc.cx(0, 1); qc.measure([0, 1], [0, 1])
    job = backend.run(qc, shots=1000)          # placed and acknowledged by qrtd
    print(job.result().get_counts())           # {'00': 497, '11': 503}
    print(job.result().metadata["calibration_id"])

The target comes from what qrtd serves for the QPU in qpus.list ("device",
from the [qpu.device] sub-table of qrtd.toml).  Each run is one qrtd job: an
OpenQASM 3 envelope holding every circuit and the shot count (qrtd(8), "Job
payloads").  Errors are QrtdError (a QiskitError) carrying qrtd's reason.
"""

from .backend import JOB_STATUS, QrtdBackend, QrtdError, QrtdJob, QrtdJobError, job_status, make_envelope

__all__ = ["JOB_STATUS", "QrtdBackend", "QrtdError", "QrtdJob", "QrtdJobError", "job_status", "make_envelope"]
__version__ = "0.1.0"
