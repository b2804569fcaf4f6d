#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_config, fuzz_wire and fuzz_bpf_decode.

  corpus/config/      the shipped configs (config/*.toml, profiles) and a few
                      broken ones; byte 0 says whether online CPUs are known.
  corpus/wire/        QPU endpoint streams: HELLO, JOB, RESULT, ERROR frames,
                      back to back, torn, with each header field wrong once;
                      version 2: the capabilities HELLO, ARMED with its
                      costs, DISARMED, RESULT with the endpoint's times,
                      ERROR with a stage, FIRE, each v2 field wrong once.
  corpus/bpf_decode/  byte 0 picks the record: 0 a probe-3 ring record
                      (struct qrt_outlier_event), 1 probe-2 map entries
                      (qrt_intrusion_key + qrt_intrusion_value), 2 per-CPU
                      qrt_wakeup_hist.  Layouts from bpf/progs/*.h.

  corpus/rpc/sched_submit_*
                      jobs.submit lines (byte 0: the scheduler role) whose
                      payload nests deeply where the envelope is read
                      (format, shots, circuits, an unknown member), has a
                      format of the wrong type, or only looks like deep
                      JSON; the other rpc seeds are written by hand.

fuzz_calibration's seeds (corpus/calibration/) are inputs its own runs found
(FuzzedDataProvider bytes are not written by hand); they are kept as they are.
Run this again after changing one of those layouts.
"""
import base64
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(here, "..", ".."))


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- config
def config_seeds():
    for rel in ("config/qrtd.toml", "config/demo.toml", "config/profiles/low-latency.toml",
                "config/profiles/two-qpus.toml"):
        with open(os.path.join(root, rel), "rb") as f:
            text = f.read()
        base = os.path.basename(rel).replace(".toml", "")
        write("config", base, b"\x00" + text)
        write("config", base + "-online", b"\x01" + text)
    bad = {
        "malformed": b'[agent\nsocket = "/run/x"\n',
        "out-of-range": b"[dispatch]\npriority = 150\n",
        "unknown-key": b"[agent]\nno_such_option = 1\n",
        "wrong-type": b'[dispatch]\npriority = "high"\n',
        "two-qpus-same-cpu": b'[[qpu]]\nname = "a"\nendpoint = "unix:/run/a"\ndispatch_cpu = 1\n'
                             b'[[qpu]]\nname = "b"\nendpoint = "tcp://127.0.0.1:9"\ndispatch_cpu = 1\n',
        "isolated-all": b'\x01[host]\nisolated_cpus = "0-3"\n',
    }
    for name, text in bad.items():
        write("config", name, text if text[:1] == b"\x01" else b"\x00" + text)


# ---------------------------------------------------------------- wire
MAGIC = 0x57545251


def header(typ, payload_len=0, flags=0, status=0, version=1, header_len=96, reserved=0, magic=MAGIC,
           job_id=7, cal=3, sched=1_800_000_000_000_000_000, sent=1_800_000_000_000_000_100,
           wfrom=1_799_999_999_999_000_000, wuntil=1_800_000_000_010_000_000, dur=1_000_000,
           arrival=0, shots=100, tol=50_000):
    return struct.pack("<IHBBHHIQQqqqqqqIIq", magic, version, typ, flags, header_len, status,
                       payload_len, job_id, cal, sched, sent, wfrom, wuntil, dur, arrival, shots,
                       reserved, tol)


def frame(typ, payload=b"", **kw):
    return header(typ, len(payload), **kw) + payload


def frame2(typ, payload=b"", armed=0, started=0, ended=0, stage=0, r2=0, r3=0, r4=0, **kw):
    kw.setdefault("version", 2)
    kw.setdefault("header_len", 128)
    return (header(typ, len(payload), **kw) + struct.pack("<qqqBBHI", armed, started, ended, stage, r2, r3, r4)
            + payload)


def wire_seeds():
    hello = frame(1, b"qpu-sim 0.1.0 qpu=0")
    job = frame(2, b"OPENQASM 3; qubit q; h q; measure q;", flags=1)
    result = frame(3, b"0 51\n1 49\n", arrival=1_800_000_000_000_000_050, flags=4)
    error = frame(4, b"arrived late", status=3)
    seeds = {
        "hello": hello, "job": job, "result": result, "error": error,
        "session": hello + result + result + error,
        "torn": hello + result[:50],
        "bad-magic": b"GET / HTTP/1.1\r\n\r\n",
        "bad-version": frame(1, b"x", version=2),
        "bad-header-len": frame(1, b"x", header_len=64),
        "bad-type": frame(9),
        "bad-flags": frame(3, flags=0x80),
        "bad-status": frame(3, status=2),
        "bad-reserved": frame(3, reserved=1),
        "huge-hello": header(1, 4096) + b"x" * 300,
        "huge-payload": header(3, (1 << 20) + 1),
    }
    caps = json.dumps({"identity": "qpu-sim 0.2.0", "two_phase": True, "max_armed": 8, "horizon_ns": 10**10,
                       "min_lead_ns": 2 * 10**8, "start": "on_fire", "session": "ab" * 16}).encode()
    hello2 = frame2(1, caps)
    armed = frame2(6, json.dumps({"stages": [{"name": "compile", "ns": 1000}, {"name": "upload", "ns": 200000},
                                             {"name": "vendor", "ns": 5}], "program_duration_ns": 9000}).encode(),
                   armed=1_799_999_999_800_000_000)
    result2 = frame2(3, b'{"format":"qasm3-counts"}', arrival=1_800_000_000_000_000_050,
                     armed=1_799_999_999_800_000_000, started=1_800_000_000_000_000_060,
                     ended=1_800_000_000_001_000_060)
    seeds.update({
        "v2-hello": hello2,
        "v2-fire-hello": frame2(1, b'{"channel":"fire","session":"abab"}'),
        "v2-session": hello + hello2 + armed + result2 + frame2(9) + frame2(4, b"program refused: line 3",
                                                                       status=7, stage=1),
        "v2-armed-bad-json": frame2(6, b'{"stages": [{"name": 1}]'),
        "v2-fire": frame2(7),
        "v2-fire-with-payload": frame2(7, b"x"),
        "v2-bad-stage": frame2(4, b"x", status=7, stage=99),
        "v2-stage-on-result": frame2(3, stage=1),
        "v2-bad-reserved": frame2(9, r3=1),
        "v2-short-header": frame2(6)[:110],
        "v2-in-v1": frame(5, b"x"),
    })
    for name, data in seeds.items():
        write("wire", name, b"\x05" + data)
    write("wire", "session-bytewise", b"\x40" + hello + result)
    write("wire", "v2-session-bytewise", b"\x40" + hello + hello2 + armed + result2)


# ---------------------------------------------------------------- bpf
def outlier_event(records, tid=4242, cpu=1, waker=0, wakeup=1_000_000, switch=1_900_000):
    ev = struct.pack("<QQQIIII16s", wakeup, switch, (switch - wakeup) % 2**64, tid, cpu, waker, len(records),
                     b"qrt-dispatch-0\0\0")
    slots = []
    for i in range(16):
        if i < len(records):
            start, dur, kind, ident, name = records[i]
            slots.append(struct.pack("<QQII32s", start, dur, kind, ident, name))
        else:
            slots.append(b"\0" * 56)
    return ev + b"".join(slots)


def intrusion(kind, cpu, ident, name, count, total, mx, last):
    return struct.pack("<IIII32s", kind, cpu, ident, 0, name) + struct.pack("<QQQQ", count, total, mx, last)


def wakeup_hist(values):
    buckets = [0] * 272
    for v in values:
        if v < 8:
            b = v
        else:
            p = v.bit_length() - 1
            b = 271 if p >= 36 else (p - 3 + 1) * 8 + ((v >> (p - 3)) & 7)
        buckets[b] += 1
    return struct.pack("<272Q", *buckets) + struct.pack("<QQQ", len(values), sum(values), max(values, default=0))


def bpf_seeds():
    ev = outlier_event([(900_000, 50_000, 3, 999, b"stress-ng-cpu"),
                        (1_100_000, 700_000, 3, 999, b"stress-ng-cpu"),
                        (1_850_000, 3_000, 4, 236, b""),
                        (1_860_000, 2_000, 1, 24, b"eth0" + b"x" * 28)])
    write("bpf_decode", "outlier", b"\x00" + ev)
    write("bpf_decode", "outlier-empty", b"\x00" + outlier_event([]))
    write("bpf_decode", "outlier-short", b"\x00" + ev[:100])
    write("bpf_decode", "outlier-longer", b"\x00" + ev + b"\x01" * 64)
    write("bpf_decode", "outlier-wrap", b"\x00" + outlier_event(
        [(2**64 - 10, 100, 2, 7, b""), (5, 2**64 - 1, 9, 1, b"\xff" * 32)], wakeup=10, switch=5))
    ents = (intrusion(1, 1, 24, b"eth0", 10, 5000, 900, 77) + intrusion(1, 2, 24, b"eth0", 3, 100, 50, 80) +
            intrusion(2, 1, 1, b"", 100, 70000, 2000, 90) + intrusion(3, 1, 999, b"stress-ng-cpu", 2, 1_000_000, 900_000, 91) +
            intrusion(4, 1, 236, b"", 1000, 2_000_000, 3000, 92))
    write("bpf_decode", "intrusions", b"\x01" + ents)
    write("bpf_decode", "intrusions-odd", b"\x01" + intrusion(7, 2**32 - 1, 2**32 - 1, b"z" * 32, 2**64 - 1, 2**64 - 1, 1, 1) * 2)
    write("bpf_decode", "histogram", b"\x02" + wakeup_hist([1500, 2100, 2500, 9000, 120000]) + wakeup_hist([3, 70_000_000_000]))
    write("bpf_decode", "histogram-empty", b"\x02" + wakeup_hist([]))


def rpc_payload_seeds():
    # fuzz_rpc_request's world: payloads of at most 1024 bytes, lines of
    # 4096, JSON nested at most 32 levels (its engine_limits).
    bell = 'OPENQASM 3.0;\nqubit[1] q;\nbit[1] c;\nh q[0];\nc[0] = measure q[0];\n'
    circuit = json.dumps([{"name": "c", "qubits": 1, "qasm": bell}])

    def nested(depth, inner):
        return "[" * depth + inner + "]" * depth

    def submit(key, payload):
        params = {"duration_ns": 1000000, "not_before_ns": 1800003660000000000,
                  "deadline_ns": 1800003661000000000, "qpus": ["q0"], "idempotency_key": key,
                  "payload": base64.b64encode(payload.encode()).decode()}
        assert len(payload) <= 1024, key
        return json.dumps({"jsonrpc": "2.0", "method": "jobs.submit", "id": 1, "params": params}) + "\n"

    payloads = {
        "nested_format": '{"format": ' + nested(300, '"qasm3"') + ', "shots": 1, "circuits": ' + circuit + "}",
        "nested_shots": '{"format": "qasm3", "shots": ' + nested(300, "1") + ', "circuits": ' + circuit + "}",
        "nested_circuits": '{"format": "qasm3", "shots": 1, "circuits": ' + nested(300, circuit) + "}",
        "nested_member": '{"format": "qasm3", "shots": 1, "circuits": ' + circuit + ', "x": ' +
                         '{"a": ' * 100 + "1" + "}" * 100 + "}",
        "format_array": '{"format": ' + nested(3, '"qasm3"') + ', "shots": 1, "circuits": ' + circuit + "}",
        "deep_not_json": '{"format": ' + "[" * 400,
    }
    for name, payload in payloads.items():
        line = submit(name, payload)
        assert len(line) <= 4096, name
        write("rpc", "sched_submit_" + name, b"\x42" + line.encode())


config_seeds()
wire_seeds()
bpf_seeds()
rpc_payload_seeds()
