"""The configuration: the steps it builds, and each mistake named."""

import pytest

from qrt_calibration.cli import main
from qrt_calibration.config import ConfigError, build_step, load

GOOD = """
socket = "/run/qrtd/qrtd.sock"
[[qpu]]
name = "qpu0"
qubits = [0, 1]
threshold = 0.9
[[step]]
kind = "x_amplitude"
staleness_s = 7200
duration_s = 2
[[step]]
kind = "readout"
staleness_s = 14400
duration_s = 1
"""


def test_a_good_configuration(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(GOOD)
    cfg = load(f)
    assert [q.name for q in cfg.qpus] == ["qpu0"] and cfg.qpus[0].qubits == [0, 1]
    steps = [build_step("s", t) for t in cfg.steps]
    assert [(s.name, s.duration_ns) for s in steps] == [("x_amplitude", 2_000_000_000), ("readout", 1_000_000_000)]


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("threshold = 0.9", "treshold = 0.9"), "unknown keys \\['treshold'\\]"),
    (GOOD.replace("qubits = [0, 1]", "qubits = []"), "qpu\\[0\\].qubits"),
    (GOOD.replace('kind = "readout"', 'kind = "nowhere:Step"'), "step\\[1\\].kind 'nowhere:Step'"),
    (GOOD.replace('kind = "readout"', 'kind = "x_amplitude"'), "step names must differ"),
    (GOOD.replace("duration_s = 1\n", "duration_s = 0\n"), "staleness_s and duration_s must be > 0"),
    ("[[qpu]\n", "c.toml"),
])
def test_each_mistake_is_named(tmp_path, text, message):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(f)


def test_the_command_says_what_is_wrong(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text(GOOD.replace("threshold", "treshold"))
    assert main(["check", "-c", str(f)]) == 2
    assert "unknown keys ['treshold']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "examples:" in capsys.readouterr().out
