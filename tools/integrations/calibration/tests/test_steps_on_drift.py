"""The reference steps on qpu-aer's drifting device, without qrtd: the
qiskit-experiments runs measure the drift, qpu-aer's set writer turns the
measurements into a set, and under that set the fixed circuit's error is
back at its baseline.  (The loop through qrtd is
tests/integration/calibration/test_loop.py.)"""

import qpu_aer_drift as D
from qiskit import QuantumCircuit
from qiskit_aer import AerSimulator

from qrt_calibration.model import reference_fidelity
from qrt_calibration.steps import Readout, XAmplitude, over_rotation_and_readout

QUBITS = [0, 1]
DEPTH = 16
SHOTS = 4000


def device(drift, s, t_ns):
    return AerSimulator(noise_model=D.noise_model(drift.noise_spec(s, t_ns, 2)), seed_simulator=11)


def fixed_circuit():
    qc = QuantumCircuit(2, 2, name="fixed")
    for _ in range(DEPTH):
        qc.x(0)
        qc.x(1)
    qc.measure([0, 1], [0, 1])
    return qc


def error(backend):
    counts = backend.run(fixed_circuit(), shots=SHOTS, seed_simulator=5).result().get_counts()
    wrong = sum(n * (bits.count("1")) for bits, n in counts.items())
    return wrong / (2 * SHOTS)


def test_measure_correct_and_the_error_is_back_at_its_baseline(tmp_path):
    drift = D.Drift(x_gain_per_hour=0.01, readout_shift_per_hour=0.15, origin_ns=0)
    writer = D.AerSetWriter(tmp_path, "qpu0")
    nominal = writer.nominal(1)
    t = int(1.5 * D.NS_PER_HOUR)
    before = error(device(drift, nominal, 0))
    stale = error(device(drift, nominal, t))
    opts = {"seed_simulator": 3}
    x = XAmplitude().run(device(drift, nominal, t), QUBITS, opts)
    ro = Readout().run(device(drift, nominal, t), QUBITS, opts)
    assert not x.in_spec and not ro.in_spec
    for q in QUBITS:
        assert abs(x.qubits[q]["d_theta"] - drift.over_rotation(q, t, nominal.params(q))) < 0.005
    new = writer.apply(nominal, x.step, x.to_json(), 2, t)
    new = writer.apply(new, ro.step, ro.to_json(), 2, t)
    after = error(device(drift, new, t))
    print(f"fixed circuit error: {before:.4f} before drift, {stale:.4f} after 1.5 h, {after:.4f} calibrated")
    assert stale > before + 0.05
    assert after < before + 0.015
    # The service's fidelity from the measurements predicts the stale error.
    rot, rd = over_rotation_and_readout({x.step: x, ro.step: ro})
    assert abs((1 - reference_fidelity(rot, rd, DEPTH)) - stale) < 0.03
    # And the checks of the new set are in spec.
    assert XAmplitude().check(device(drift, new, t), QUBITS, opts).in_spec
    assert Readout().check(device(drift, new, t), QUBITS, opts).in_spec
