#!/usr/bin/env bash
# The GPU benchmark (`just bench-gpu`), run on a GPU machine from gpu/bin (.ci/gpu-build.sh):
# upcc against PyTorch on the same GPU, one JSON line per figure.
#   1. one training step of the paper's autoencoder, batch 256 and 1024 (upcc; PyTorch eager,
#      back to back, CUDA graph);
#   2. one ProbPair epoch of the smoke multi3 cell with 9k constraints (upcc; PyTorch eager and
#      CUDA graph on the same shapes), and upcc's ECI-PP epoch on that cell, by part;
#   3. the full ECI-PP cell at the paper's settings on the MNIST sample
#      (experiments/mnist5k-eci-cell.yaml), wall time per node and per part;
#   4. the smoke spec end to end.
# `bash .ci/bench-gpu.sh 1 2` runs only those parts (a device command may run 10 minutes).
set -uo pipefail
parts=" ${*:-1 2 3 4} "
want() { [[ "$parts" == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
# UPCC_BENCH_DEVICE=cpu dry-runs parts 2-4 on the CPU (to check this script without a GPU).
DEV="${UPCC_BENCH_DEVICE:-cuda}"
if [ "$DEV" = cuda ] && [ ! -e /proc/driver/nvidia/version ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "bench-gpu: no GPU, nothing measured"
    exit 1
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
UPCC="${UPCC_BIN:-gpu/bin/upcc}"
work="${UPCC_GPU_WORK:-$(mktemp -d)}"
py=python3
nodes_json() {  # store spec selectors...: one JSON line per executed node with its timings
    local store=$1 spec=$2; shift 2
    "$UPCC" --store "$store" --device "$DEV" run "$spec" "$@" --json --progress none > "$work/run.json" || return 1
    $py - "$UPCC" "$store" "$spec" "$work/run.json" "$DEV" "$@" <<'PY'
import json, subprocess, sys
upcc, store, spec, path, dev = sys.argv[1:6]
rest = sys.argv[6:]
sets = [a for i, a in enumerate(rest) if a == "--set" or (i > 0 and rest[i - 1] == "--set")]
run = json.load(open(path))
for n in run["nodes"]:
    if n["outcome"] != "executed":
        continue
    m = json.loads(subprocess.run([upcc, "--store", store, "--device", dev, "explain", spec, n["id"], "--json", *sets],
                                  capture_output=True, text=True).stdout)["manifest"]
    s = {k: round(v, 4) for k, v in m["summary"].items() if k.startswith("seconds")}
    print(json.dumps({"node": n["id"], "wall_s": round(n["duration_s"], 2), **s}))
print(json.dumps({"total_s": round(run["seconds"], 2), "nodes_executed": run["executed"]}))
PY
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
if want 1; then
    echo "== 1. one training step of the paper's autoencoder"
    DEVICE=cuda gpu/bin/ae_step 256 1024
    if $py -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
        $py stages/nn/benches/torch_gpu.py
    else
        echo '{"impl":"pytorch","error":"PyTorch with CUDA is not importable here; see ../shared/reference/gpu-machine.md for its figures on this GPU"}'
    fi
fi
if want 2; then
    echo "== 2. ProbPair and ECI-PP epochs, smoke multi3 cell, 9k constraints (trial 1)"
    nodes_json "$work/epochs" experiments/smoke.yaml target=eci supervision=multi3 method=probpair,eci-pp trial=1 \
        --set constraints.budget=9000
fi
if want 3; then
    echo "== 3. the full ECI-PP cell at the paper's settings on the MNIST sample"
    nodes_json "$work/cell" experiments/mnist5k-eci-cell.yaml
fi
if want 4; then
    echo "== 4. the smoke spec end to end"
    start=$(date +%s.%N)
    "$UPCC" --store "$work/smoke" --device "$DEV" run experiments/smoke.yaml --progress none > /dev/null
    end=$(date +%s.%N)
    $py -c "print('{\"bench\":\"smoke run\",\"device\":\"$DEV\",\"wall_s\":%.1f}' % ($end - $start))"
fi
