#!/usr/bin/env python3
"""How far rounding alone moves the smoke cells' test NMI (the bound of the GPU suite's `cells`
check, tests/gpu/e2e.py, and of tests/it/soft_gpu.rs).

Runs the cells of e2e.py on the CPU once with upcc's pinned product blocking (512) and once
per other depth block N (UPCC_TEST_K_BLOCK=N: the CPU's products split every N terms, a change
of rounding and nothing else, with its own numerics class), then prints each cell's test NMI
(x 100) per N, the difference from 512 per cell and its mean over the cells, and the largest.

Usage: rounding_spread.py UPCC STORE [N,N,...] [-- --set KEY=VALUE ...]
Default N: 500,448,384,320,256,100,33. Standard library only.
"""
import json
import os
import subprocess
import sys
import time

UPCC, STORE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
rest = sys.argv[3:]
extra = rest[rest.index("--") + 1:] if "--" in rest else []
head = rest[: rest.index("--")] if "--" in rest else rest
blocks = [512] + [int(n) for n in (head[0] if head else "500,448,384,320,256,100,33").split(",")]
SPEC = "experiments/smoke.yaml"
CELLS = ["method=probpair,eci-pp", "pretrain=true", "trial=1", "target=eci"]
ORDER = ["lv0.01/probpair", "lv0.01/eci-pp", "multi3/probpair", "multi3/eci-pp"]


def upcc(args, kb):
    env = dict(os.environ)
    env.pop("UPCC_TEST_K_BLOCK", None)
    if kb != 512:
        env["UPCC_TEST_K_BLOCK"] = str(kb)
    p = subprocess.run([UPCC, "--store", STORE, "--device", "cpu", *args, *extra],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"upcc {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


nmi = {}
for kb in blocks:
    t0 = time.time()
    run = upcc(["run", SPEC, *CELLS, "--json", "--progress", "none"], kb)
    for n in run["nodes"]:
        if n["stage"] == "metrics":
            cell = "/".join(n["id"].split("/")[2:4])
            m = upcc(["explain", SPEC, n["id"], "--json"], kb)["manifest"]["summary"]
            nmi.setdefault(kb, {})[cell] = m["test_nmi_geometric"] * 100
    print(f"N = {kb}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

print("| N | " + " | ".join(ORDER) + " | mean Δ vs 512 |")
print("|---|" + "---|" * (len(ORDER) + 1))
worst_cell = worst_mean = 0.0
for kb in blocks:
    row = nmi[kb]
    if kb == 512:
        print(f"| 512 (pinned) | " + " | ".join(f"{row[c]:.2f}" for c in ORDER) + " | |")
        continue
    d = [row[c] - nmi[512][c] for c in ORDER]
    mean = sum(d) / len(d)
    worst_cell = max(worst_cell, max(abs(x) for x in d))
    worst_mean = max(worst_mean, abs(mean))
    print(f"| {kb} | " + " | ".join(f"{row[c]:.2f} ({x:+.2f})" for c, x in zip(ORDER, d)) + f" | {mean:+.2f} |")
print(f"\nlargest move of one cell: {worst_cell:.2f} NMI points; of the mean of the four: {worst_mean:.2f}")
