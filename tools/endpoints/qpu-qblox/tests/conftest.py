import pytest

from qpu_qblox import calibration, dummy
from qpu_qblox.stack import QbloxStack


@pytest.fixture
def lab(tmp_path, monkeypatch):
    # the dummy's assembler (the bundled one) writes tmp.q1asm in the cwd
    monkeypatch.chdir(tmp_path)
    calibration.write_set(tmp_path, "qpu0", 1, calibration.example_device(), calibration.example_hardware())
    cluster = dummy.dummy_cluster("cluster0", calibration.EXAMPLE_MODULES)
    stack = QbloxStack(cluster, calibration.CalibrationStore(tmp_path, "qpu0"))
    yield stack, tmp_path
    stack.close()
