#!/usr/bin/env bash
# Build what the GPU machine runs (it has no Rust toolchain): the `upcc` binary, the CUDA op
# tests and the autoencoder-step benchmark, stripped, into gpu/bin (git-ignored). Carry `gpu`
# with the device tool and run `bash .ci/gpu-test.sh` or `bash .ci/bench-gpu.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${UPCC_CI_TARGET_DIR:-/var/tmp/upcc-ci-target}"
out=gpu/bin
mkdir -p "$out"
cargo build --release --locked --bin upcc
cargo build --release --locked -p upcc-nn --example ae_step
tests=$(cargo test --release --locked -p upcc-nn --test cuda_ops --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_ops":
        print(m["executable"])' | tail -1)
cp "$CARGO_TARGET_DIR/release/upcc" "$out/upcc"
cp "$CARGO_TARGET_DIR/release/examples/ae_step" "$out/ae_step"
cp "$tests" "$out/cuda_ops"
strip "$out"/upcc "$out"/ae_step "$out"/cuda_ops
du -ch "$out"/* | tail -n 4
echo "gpu/bin ready: carry [\"gpu\"] and run: bash .ci/gpu-test.sh  (or bash .ci/bench-gpu.sh)"
