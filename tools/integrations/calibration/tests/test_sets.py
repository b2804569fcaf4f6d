"""qpu-aer's calibration sets: written whole, never changed, refused when
another may write them; and the set writer's corrections."""

import json
import math
import os

import pytest
import qpu_aer_drift as D

from qrt_calibration.sets import load_writer, next_id


def test_write_and_read_a_set(tmp_path):
    s = D.AerSet(3, 123, {0: D.QubitParams(0.99, 0.1)})
    path = D.write_set(tmp_path / "qpu0", s)
    assert path == tmp_path / "qpu0" / "3"
    assert D.load_set(tmp_path / "qpu0", 3) == s
    assert oct(os.stat(path / D.SET_FILE).st_mode & 0o777) == "0o644"
    with pytest.raises(D.SetError, match="never changed"):
        D.write_set(tmp_path / "qpu0", s)
    assert [p.name for p in (tmp_path / "qpu0").iterdir()] == ["3"]  # no temporary left


def test_a_set_writable_by_others_or_missing_or_malformed_is_refused(tmp_path):
    D.write_set(tmp_path / "qpu0", D.AerSet(1))
    f = tmp_path / "qpu0" / "1" / D.SET_FILE
    os.chmod(f, 0o664)
    with pytest.raises(D.SetError, match="writable by group or others"):
        D.load_set(tmp_path / "qpu0", 1)
    with pytest.raises(D.SetError, match="no calibration set 2"):
        D.load_set(tmp_path / "qpu0", 2)
    with pytest.raises(D.SetError, match="x_amp"):
        D.parse_set({"format": D.SET_FORMAT, "version": 1, "calibration_id": 1,
                     "qubits": {"0": {"x_amp": 7}}}, "x")
    with pytest.raises(D.SetError, match="format"):
        D.parse_set(json.loads('{"calibration_id": 1}'), "x")


def test_next_id_is_past_every_set_and_window(tmp_path):
    assert next_id(tmp_path, "qpu0") == 1
    D.write_set(tmp_path / "qpu0", D.AerSet(4))
    assert next_id(tmp_path, "qpu0") == 5
    assert next_id(tmp_path, "qpu0", 9) == 10


def test_the_writer_corrects_what_was_measured(tmp_path):
    w = load_writer("qpu_aer_drift:AerSetWriter", tmp_path, "qpu0")
    drift = D.Drift(x_gain_per_hour=0.01, readout_shift_per_hour=0.2, time_scale=1.0, origin_ns=0)
    t = 2 * D.NS_PER_HOUR
    s = w.nominal(1)
    d_theta = drift.over_rotation(0, t, s.params(0))
    p10, p01 = drift.readout(0, t, s.params(0))
    assert d_theta > 0.05 and p01 > 0.05
    s2 = w.apply(s, "x_amplitude", {"qubits": {"0": {"d_theta": d_theta}}}, 2, t)
    s2 = w.apply(s2, "readout", {"qubits": {"0": {"p10": p10, "p01": p01}}}, 2, t)
    assert drift.over_rotation(0, t, s2.params(0)) == pytest.approx(0.0, abs=1e-12)
    b10, b01 = drift.readout(0, t, s2.params(0))
    base = D.q_tail(1 / drift.readout_sigma)
    assert b10 == pytest.approx(base, rel=1e-6) and b01 == pytest.approx(base, rel=1e-6)
    assert w.write(s2).name == "2"
    with pytest.raises(D.SetError, match="no parameter for step"):
        w.apply(s, "t1", {"qubits": {}}, 3, t)


def test_drift_grows_with_time_and_qubit():
    drift = D.Drift(x_gain_per_hour=0.01, time_scale=60.0, origin_ns=0)
    nominal = D.NOMINAL
    one_min = 60 * 1_000_000_000  # an hour of device time at 60x
    assert drift.over_rotation(0, 0, nominal) == 0.0
    assert drift.over_rotation(0, one_min, nominal) == pytest.approx(math.pi * 0.01)
    assert drift.over_rotation(1, one_min, nominal) == pytest.approx(math.pi * 0.0125)
