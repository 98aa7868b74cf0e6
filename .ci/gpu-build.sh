#!/usr/bin/env bash
# Build what the GPU machine runs (it has no Rust toolchain): the `upcc` binary, the CUDA op
# tests and the autoencoder-step benchmark, stripped, into gpu/bin (git-ignored). Then carry
# `gpu` with the device tool and run `bash .ci/gpu-test.sh PART` / `bash .ci/bench-gpu.sh PART`
# there (README: "On a GPU machine"). Any build error stops it with cargo's message; a carry
# larger than the device tool takes (64 MiB with the working tree) is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${UPCC_CI_TARGET_DIR:-/var/tmp/upcc-ci-target}"
# The most gpu/ may hold: the device tool carries 64 MiB in all, the working tree included.
limit_mb="${UPCC_CARRY_LIMIT_MB:-60}"
out=gpu/bin
rm -rf "$out"
mkdir -p "$out"
echo "== cargo build (release): upcc, the ae_step example, the cuda_ops tests"
cargo build --release --locked --bin upcc
cargo build --release --locked -p upcc-nn --example ae_step
cargo test --release --locked -p upcc-nn --test cuda_ops --no-run
tests=$(cargo test --release --locked -p upcc-nn --test cuda_ops --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_ops":
        print(m["executable"])' | tail -1)
if [ -z "$tests" ] || [ ! -x "$tests" ]; then
    echo "gpu-build: the cuda_ops test binary was not found" >&2
    exit 1
fi
cp "$CARGO_TARGET_DIR/release/upcc" "$out/upcc"
cp "$CARGO_TARGET_DIR/release/examples/ae_step" "$out/ae_step"
cp "$tests" "$out/cuda_ops"
strip "$out"/upcc "$out"/ae_step "$out"/cuda_ops
du -ch "$out"/* | tail -n 4
total_kb=$(du -sk gpu | cut -f1)
tree_kb=$(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
if [ $(( (total_kb + tree_kb) / 1024 )) -gt "$limit_mb" ]; then
    echo "gpu-build: gpu/ ($(( total_kb / 1024 )) MiB) and the tracked tree ($(( tree_kb / 1024 )) MiB) exceed the ${limit_mb} MiB carry limit; nothing to carry" >&2
    rm -rf gpu
    exit 1
fi
echo "gpu/bin ready ($(( total_kb / 1024 )) MiB + $(( tree_kb / 1024 )) MiB tree, limit ${limit_mb} MiB): carry [\"gpu\"] and run"
echo "  bash .ci/gpu-test.sh device; bash .ci/gpu-test.sh ops; bash .ci/gpu-test.sh cells; bash .ci/gpu-test.sh smoke"
