#!/usr/bin/env python3
"""End-to-end checks of upcc on a GPU (run through .ci/gpu-test.sh, part `cells` or `smoke`).

cells: ProbPair and ECI-PP on the smoke cells (MNIST sample, multi3 and lv0.01, pretrained,
       trial 1) trained on the GPU and on the CPU: test NMI within 1.5 points; every training
       node carries the GPU's numerics class and device facts; a forced rerun of the GPU nodes
       reproduces every output byte for byte.
smoke: the smoke spec end to end with --device cuda.

Standard library only (the GPU machine has no network). Prints PASS/FAIL per check and exits
0 only if every check passed.
Usage: e2e.py UPCC_BINARY WORKDIR cells|smoke
"""
import json
import os
import subprocess
import sys
import time

UPCC = os.path.abspath(sys.argv[1])
WORK = os.path.abspath(sys.argv[2])
PART = sys.argv[3] if len(sys.argv) > 3 else "cells"
SPEC = "experiments/smoke.yaml"
# UPCC_E2E_DEVICE=cpu dry-runs the script's mechanics without a GPU (its GPU checks then fail).
GPU = os.environ.get("UPCC_E2E_DEVICE", "cuda")
CELLS = ["method=probpair,eci-pp", "pretrain=true", "trial=1", "target=eci"]
failures = []


def upcc(*args, store, device, check=True):
    cmd = [UPCC, "--store", store, "--device", device, *args]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.time() - t0
    print(f"$ upcc --device {device} {' '.join(args)}  ({dt:.1f} s, exit {p.returncode})", flush=True)
    if check and p.returncode != 0:
        print(p.stdout[-4000:])
        print(p.stderr[-4000:])
        raise SystemExit(f"FAIL: upcc exited {p.returncode}")
    return p


def report(store, device):
    return json.loads(upcc("run", SPEC, *CELLS, "--json", "--progress", "none", store=store, device=device).stdout)


def summary(store, device, node):
    p = upcc("explain", SPEC, node, "--json", store=store, device=device)
    return json.loads(p.stdout)["manifest"]


def check(name, ok, detail):
    print(("PASS " if ok else "FAIL ") + name + ": " + detail, flush=True)
    if not ok:
        failures.append(name)


def cells():
    store = os.path.join(WORK, "store")
    gpu = report(store, GPU)
    check("run JSON names the GPU", gpu.get("device", "").startswith("cuda")
          and gpu.get("numerics", "").startswith("cuda-f32-sm"),
          f"device {gpu.get('device')}, numerics {gpu.get('numerics')}")
    cpu = report(store, "cpu")
    metrics = sorted(n["id"] for n in gpu["nodes"] if n["stage"] == "metrics")
    check("cells ran", len(metrics) == 4, f"{len(metrics)} metric nodes: {metrics}")
    for node in metrics:
        g = summary(store, GPU, node)["summary"]["test_nmi_geometric"] * 100
        c = summary(store, "cpu", node)["summary"]["test_nmi_geometric"] * 100
        check(f"NMI {node}", abs(g - c) <= 1.5, f"GPU {g:.2f} vs CPU {c:.2f} (|Δ| ≤ 1.5)")
    # Every training-like node carries the GPU's numerics class.
    train = [n for n in gpu["nodes"] if n["stage"] in ("train", "eci-pp", "pretrain", "expert")]
    check("training nodes ran", len(train) > 0, f"{len(train)} training nodes")
    for n in train[:1]:
        m = summary(store, GPU, n["id"])
        numerics = m["material"]["numerics"]
        check("numerics class", numerics.startswith("cuda-f32-sm") and "-nvrtc" in numerics,
              f"{n['id']}: {numerics}")
        libs = m["provenance"]["libraries"]
        check("provenance", "device.gpu" in libs and "device.cublas" in libs,
              ", ".join(f"{k}={v}" for k, v in libs.items() if k.startswith("device")))
    # Determinism: force the GPU nodes again; every output digest must be the same.
    before = {n["id"]: summary(store, GPU, n["id"])["outputs"] for n in train}
    upcc("run", SPEC, *CELLS, "--force", "--progress", "none", store=store, device=GPU)
    after = {n["id"]: summary(store, GPU, n["id"])["outputs"] for n in train}
    same = sum(1 for k in before if {o: v["digest"] for o, v in before[k].items()} ==
               {o: v["digest"] for o, v in after[k].items()})
    check("bitwise reruns", same == len(before) and same > 0,
          f"{same}/{len(before)} training nodes reproduced every byte")


def smoke():
    store = os.path.join(WORK, "smoke")
    t0 = time.time()
    p = upcc("run", SPEC, "--progress", "none", store=store, device=GPU, check=False)
    check("smoke spec end to end", p.returncode == 0 and "###" in p.stdout,
          f"exit {p.returncode} in {time.time() - t0:.1f} s")
    if p.returncode == 0:
        print(p.stdout)
    else:
        print(p.stderr[-4000:])


def main():
    os.makedirs(WORK, exist_ok=True)
    if PART == "cells":
        cells()
    elif PART == "smoke":
        smoke()
    else:
        raise SystemExit(f"unknown part {PART!r}: cells or smoke")
    print(f"{len(failures)} check(s) failed: {failures}" if failures else f"all {PART} checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
