"""qpu-aer: a QPU endpoint for qrtd that executes each job's OpenQASM 3
circuits on qiskit-aer and answers with the real counts, on the endpoint
framework (qrt_endpoint): wire version 1 (JOB at T) and version 2 (ARM
ahead of T reads and checks the circuits; FIRE runs them).  See qpu-aer(1)."""

VERSION = "0.2.0"
__version__ = VERSION
