# upcc recipes. `just --list` shows them. Everything runs through the `upcc` binary in the
# release profile (tests too: one optimised build of the dependencies serves both).

set shell := ["bash", "-euo", "pipefail", "-c"]

spec := "experiments/smoke.yaml"

# The embedded default: the smoke table on the vendored MNIST sample (a few minutes on 2 cores).
demo:
    cargo run --release -- run {{spec}}

# The test suite (the same command as the README and .ci/run).
test:
    cargo test --release --workspace

# The soft GPU (a CPU implementation of the CUDA driver and cuBLAS calls upcc makes) into DIR.
soft-gpu dir="/tmp/softgpu":
    bash .ci/soft-gpu.sh {{dir}}

# What CI runs: formatting, lints, tests.
ci:
    bash .ci/run

# Which nodes of a spec are fresh, stale (and why) or missing: `just status`, `just status experiments/smoke.yaml method=probpair`.
status spec=spec *selectors:
    cargo run --release -- status {{spec}} {{selectors}}

# Run one cell (or slice) of a spec's targets: `just cell experiments/smoke.yaml method=probpair pretrain=false trial=1`.
cell spec *selectors:
    cargo run --release -- run {{spec}} {{selectors}}

# Every compared method on the MNIST sample, reduced (Tables 1, 5, 6, 10 in small; about 12 minutes on 2 cores).
methods *args:
    cargo run --release -- run experiments/methods.yaml {{args}}

# ECI-PP's Corrector-loss and perturbation ablation on the MNIST sample (FIDELITY rows 55-56; about 70 minutes on 2 cores).
ablation *args:
    cargo run --release -- run experiments/eci-ablation.yaml {{args}}

# The paper's targets at full size (Tables 1, 3-6, 10, Figure 3) on the datasets declared in experiments/paper.yaml.
paper *args:
    cargo run --release -- run experiments/paper.yaml {{args}}

# Run every target of a spec and print its tables.
run spec=spec *args:
    cargo run --release -- run {{spec}} {{args}}

# Every target of a spec from the store, with an HTML page: `just report`, then open report/index.html.
report spec=spec out="report" *selectors:
    cargo run --release -- report {{spec}} {{selectors}} --out {{out}}

# Explain one node: `just explain experiments/smoke.yaml train/mnist5k/lv0.01/probpair/pre/t1`.
explain spec node:
    cargo run --release -- explain {{spec}} {{node}}

# Re-hash the store; quarantine corrupt objects.
verify:
    cargo run --release -- verify

# Delete what the given specs' targets do not reach (default: the smoke spec).
gc *specs=spec:
    cargo run --release -- gc {{specs}}

# Benchmarks: one training step of the paper's autoencoder in upcc and in PyTorch (same
# 2 threads; PyTorch goes into a throwaway venv, $UPCC_BENCH_VENV), then a whole smoke run.
bench:
    #!/usr/bin/env bash
    set -euo pipefail
    echo "== one training step, 784-500-500-2000-10 autoencoder + mirror decoder, Adam, 2 threads (median of 30)"
    THREADS=2 cargo run --quiet --release -p upcc-nn --example ae_step -- 256 1024
    venv="${UPCC_BENCH_VENV:-/var/tmp/upcc-bench-venv}"
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
        echo "(installing PyTorch into $venv; several GB from PyPI)"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q torch numpy
    fi
    "$venv/bin/python" stages/nn/benches/torch_step.py 256 1024
    echo "== whole smoke run ({{spec}}, fresh store, $(nproc) threads)"
    cargo build --quiet --release
    store="$(mktemp -d)"
    start=$(date +%s.%N)
    cargo run --quiet --release -- --store "$store" run {{spec}} --progress none > /dev/null
    end=$(date +%s.%N)
    echo "{\"bench\":\"smoke run\",\"wall_s\":$(echo "$end - $start" | bc)}"
    echo "== wall time per epoch, ECI-PP against ProbPair on the same data (smoke multi3 cell, trial 1; from the run above)"
    for m in probpair eci-pp; do
        cargo run --quiet --release -- --store "$store" explain {{spec}} "train/mnist5k/multi3/$m/pre/t1" --json \
            | python3 -c 'import json,sys; j=json.load(sys.stdin); s=j["manifest"]["summary"]; print(json.dumps({"method": j["id"].split("/")[3], **{k: round(v, 3) for k, v in s.items() if k.startswith("seconds")}}))'
    done
    rm -rf "$store"

# The Slurm executor's figures: job plans of the paper and smoke specs, and (with a cluster up,
# e.g. `bash .ci/slurm.sh up`) the smoke spec at small sizes locally and through Slurm workers.
bench-slurm:
    cargo build --quiet --release
    bash .ci/bench-slurm.sh target/release/upcc

# A slow bucket's cost: a 7-node spec computed + uploaded, then downloaded by a fresh store, through
# a proxy that holds every request DELAY seconds (needs a python with moto[server]: PYTHON=...).
bench-remote delay="1":
    cargo build --quiet --release
    bash .ci/bench-remote.sh target/release/upcc {{delay}}

# How far rounding alone moves the smoke cells' test NMI (the GPU suite's NMI bound): the cells on
# the CPU with their products split every N terms, per N (about 4 minutes per N on 2 cores).
rounding-spread store="/var/tmp/upcc-rounding" *args:
    cargo build --quiet --release
    python3 tests/gpu/rounding_spread.py target/release/upcc {{store}} {{args}}

# Build what the GPU machine runs (no Rust toolchain there): upcc, the CUDA op tests and the
# autoencoder-step benchmark, stripped, into gpu/bin (git-ignored). Carry `gpu` to the GPU machine.
gpu-build:
    bash .ci/gpu-build.sh

# The GPU suite, on a GPU machine (from gpu/bin; there, without `just`: bash .ci/gpu-test.sh PART):
# parts device, ops, sanitize, cells, smoke (all when none is named), each printing PASS, FAIL
# or SKIP. Without a GPU it prints "no GPU, 0 run" and fails.
gpu-test *parts:
    bash .ci/gpu-test.sh {{parts}}

# The GPU benchmark against PyTorch on the same GPU (parts 1-6, default 1-4; e.g. `just bench-gpu 1 2`).
bench-gpu *parts:
    bash .ci/bench-gpu.sh {{parts}}
