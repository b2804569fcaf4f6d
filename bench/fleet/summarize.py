#!/usr/bin/env python3
"""Markdown tables for bench/README.md from qrt-fleet-sim's JSON files.

    bench/fleet/summarize.py OUT_DIR      # OUT_DIR of bench/fleet/reproduce.sh

Reads sweep.json, scale.json and claims.json (each one JSON document) and
prints the tables bench/README.md quotes.  Stdlib only.
"""
import json
import os
import sys


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def pct(x):
    return f"{100.0 * x:.2f}"


def sweep_tables(s):
    means = s["means"]
    regimes = []
    for m in means:
        if m["regime"] not in regimes:
            regimes.append(m["regime"])
    structs = []
    for m in means:
        if m["structure"] not in structs:
            structs.append(m["structure"])
    loads = sorted({m["load"] for m in means})
    for metric, title, fmt in (("miss_rate", "deadline-miss rate, %", pct),
                               ("utilization", "utilisation inside windows", lambda x: f"{x:.3f}"),
                               ("response_p95_s", "p95 response, s", lambda x: f"{x:.0f}"),
                               ("mean_cost", "objective cost per job (lower is better)",
                                lambda x: f"{x:.4f}")):
        print(f"\n**{title}** (mean of seeds {', '.join(map(str, s['seeds']))})\n")
        print("| regime | structure | " + " | ".join(f"{l:.1f}" for l in loads) + " |")
        print("|---|---|" + "---|" * len(loads))
        for r in regimes:
            for st in structs:
                row = {m["load"]: m[metric] for m in means
                       if m["regime"] == r and m["structure"] == st}
                print(f"| {r} | {st} | " + " | ".join(fmt(row[l]) for l in loads) + " |")
    print("\n**other figures at load 0.9** (mean of seeds)\n")
    print("| regime | structure | offered | p50 s | jain | msg/job | dec ns p50 | resch/job |")
    print("|---|---|---|---|---|---|---|---|")
    for m in means:
        if abs(m["load"] - 0.9) < 1e-9:
            print(f"| {m['regime']} | {m['structure']} | {m['offered']:.2f} | "
                  f"{m['response_p50_s']:.0f} | {m['jain']:.4f} | {m['messages_per_job']:.1f} | "
                  f"{m['decide_ns_p50']:.0f} | {m['reschedules_per_job']:.3f} |")
    v = s.get("claims", {}).get("learned_vs_best_rule")
    if v:
        print("\n**learned against the best rule-based structure and against limited** "
              "(objective cost; + = learned worse)\n")
        print("| regime | load | learned | best rule | its cost | learned vs best | limited | "
              "learned vs limited |")
        print("|---|---|---|---|---|---|---|---|")
        for x in v:
            print(f"| {x['regime']} | {x['load']:.1f} | {x['learned_cost']:.4f} | {x['best_rule']} | "
                  f"{x['best_rule_cost']:.4f} | {100 * x['relative']:+.1f}% | "
                  f"{x['limited_cost']:.4f} | {100 * x['relative_to_limited']:+.1f}% |")


def scale_table(s):
    print("\n**scaling** (load 0.9, stationary, seed 1; about 20k jobs per run)\n")
    print("| hosts | structure | jobs | dec ns p50 | msg/job | miss % |")
    print("|---|---|---|---|---|---|")
    for m in s["runs"]:
        print(f"| {m['hosts']} | {m['structure']} | {m['jobs']} | {m['decide_ns_p50']:.0f} | "
              f"{m['messages_per_job']:.1f} | {pct(m['miss_rate'])} |")


def claims_tables(c):
    cl = c["claims"]
    print("\n**backfill + gang (edf-backfill) against fifo**, completed QPU-hours per hour "
          "(central structure, 20 % gangs of 2)\n")
    print("| scope | load | fifo | edf-backfill | gain | fifo miss % | edf miss % |")
    print("|---|---|---|---|---|---|---|")
    for x in cl["backfill_vs_fifo"]:
        print(f"| {x['scope']} | {x['load']:.1f} | {x['fifo']:.2f} | {x['edf_backfill']:.2f} | "
              f"{100 * x['gain']:+.1f}% | {pct(x['fifo_miss'])} | {pct(x['edf_miss'])} |")
    print("\n**admission control** (deadline compliance; central, 64 hosts)\n")
    print("| load | without | with (all jobs) | with (admitted jobs) | refused at submit |")
    print("|---|---|---|---|---|")
    for x in cl["admission"]:
        print(f"| {x['load']:.1f} | {pct(x['compliance_without'])} | {pct(x['compliance_with'])} | "
              f"{pct(x['compliance_admitted'])} | {pct(x['refused'])} |")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "bench/fleet/results"
    s = load(d, "sweep.json")
    if s:
        sweep_tables(s)
    sc = load(d, "scale.json")
    if sc:
        scale_table(sc)
    c = load(d, "claims.json")
    if c:
        claims_tables(c)


if __name__ == "__main__":
    main()
