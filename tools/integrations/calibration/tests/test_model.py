"""The fidelity model: fitted from measurements, and when it falls below a threshold."""

import math

import pytest

from qrt_calibration.model import NS_PER_S, Model, Point, crossing, fit, reference_fidelity


def test_fit_recovers_an_exponential_decay():
    f0, tau_s = 0.97, 5000.0
    pts = [Point(int(a * NS_PER_S), f0 * math.exp(-a / tau_s)) for a in (0, 600, 1200, 2400, 3600)]
    m = fit(pts, None)
    assert m is not None
    assert m.f0 == pytest.approx(f0, rel=1e-9)
    assert m.tau_ns / NS_PER_S == pytest.approx(tau_s, rel=1e-6)


def test_fit_meets_the_latest_measurement_of_a_steepening_decay():
    # A coherent over-rotation: cos^2 of a growing angle, slow then fast.
    pts = [Point(int(a * NS_PER_S), math.cos(0.01 * a) ** 2) for a in (0, 10, 20, 30, 40)]
    m = fit(pts, None)
    assert m.f0 == pytest.approx(1.0)
    assert m.at(40 * NS_PER_S) == pytest.approx(math.cos(0.4) ** 2, rel=1e-6)
    # The recent slope crosses a threshold sooner than the model does.
    c = crossing(pts, 0.8)
    assert c is not None and c < m.age_below(0.8)
    assert crossing(pts, 0.9) == 40 * NS_PER_S   # below already
    assert crossing(pts[:1], 0.5) is None


def test_one_point_takes_the_prior_decay_and_none_the_prior_itself():
    prior = Model(0.95, 777 * NS_PER_S)
    assert fit([Point(0, 0.9)], prior) == Model(0.9, 777 * NS_PER_S)
    assert fit([], prior) == prior
    assert fit([Point(0, 0.9)], None) == Model(0.9, 0)


def test_no_decay_seen_is_no_drift():
    assert fit([Point(0, 0.9), Point(NS_PER_S, 0.95)], None) == Model(0.9, 0)
    assert fit([Point(0, 0.9), Point(NS_PER_S, 0.95)], Model(0.8, 5)) == Model(0.9, 5)


def test_age_below_threshold():
    m = Model(0.98, 1000 * NS_PER_S)
    age = m.age_below(0.9)
    assert age is not None and m.at(age) == pytest.approx(0.9, rel=1e-6)
    assert Model(0.98, 0).age_below(0.9) is None
    assert Model(0.85, 1000).age_below(0.9) == 0


def test_reference_fidelity():
    # Exact gates and readout: 1; a full pi of over-rotation over the
    # circuit turns every 0 into a 1.
    assert reference_fidelity({0: 0.0}, {0: (0.0, 0.0)}, 16) == 1.0
    assert reference_fidelity({0: math.pi / 16}, {0: (0.0, 0.0)}, 16) == pytest.approx(0.0, abs=1e-12)
    assert reference_fidelity({0: 0.0, 1: 0.0}, {0: (0.02, 0.0), 1: (0.0, 0.0)}, 16) == pytest.approx(0.99)
    with pytest.raises(ValueError):
        reference_fidelity({}, {}, 16)
