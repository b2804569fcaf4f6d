import logging

import pytest
from laboneq.simple import Session

from qpu_labone import calibration
from qpu_labone.stack import LabOneStack

logging.disable(logging.WARNING)


@pytest.fixture
def lab(tmp_path):
    qpu, setup = calibration.example(thresholds=(0.0, 0.0, 0.0))
    calibration.write_set(tmp_path, "qpu0", 1, qpu)
    session = Session(setup, log_level=logging.WARNING)
    session.connect(do_emulation=True)
    stack = LabOneStack(session, calibration.CalibrationStore(tmp_path, "qpu0"))
    yield stack, tmp_path, setup
    if session.connection_state.connected:
        session.disconnect()
