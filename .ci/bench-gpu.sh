#!/usr/bin/env bash
# The GPU benchmark, run on a GPU machine from gpu/bin (.ci/gpu-build.sh): upcc against
# PyTorch on the same GPU, one JSON line per figure. Parts (each well inside the 10 minutes one
# device command may take; `bash .ci/bench-gpu.sh 1 2` runs those, no argument runs 1-4):
#   1. one training step of the paper's autoencoder, batch 256 and 1024 (upcc; PyTorch eager,
#      back to back, CUDA graph, when PyTorch with CUDA is importable there);
#   2. one ProbPair and one ECI-PP epoch of the smoke multi3 cell with 9k constraints (upcc),
#      wall time per node and per part;
#   3. the ECI-PP cell at the paper's settings on the MNIST sample
#      (experiments/mnist5k-eci-cell.yaml) on a tenth of its epoch budget (SDAE 30 layer-wise and
#      50 fine-tuning epochs instead of 300 and 500; ECI-PP 50 epochs, 5 of them warm-up,
#      instead of 500 and 50: the same mix), with the per-epoch times and the whole cell at the
#      paper's budget extrapolated from them (the full cell does not fit in one command);
#   4. the smoke spec end to end on the GPU;
#   5. the smoke spec on the CPU with every core;  6. the same on 2 cores (taskset): the
#      multi-core scaling of the CPU executor.
# Each part prints PASS, FAIL or SKIP with its time, and its figures only when it succeeded;
# the script exits non-zero if any part failed or was not run. One deadline covers the call, as
# in gpu-test.sh (UPCC_GPU_DEADLINE, default 560 s). Everything goes to one file,
# $OUT/bench-gpu.log, when $OUT is set. UPCC_BENCH_DEVICE=cpu runs parts 2-4 on the CPU (to
# check this script without a GPU); UPCC_BIN names the upcc binary (default gpu/bin/upcc; the
# step benchmark ae_step is taken from the same folder).
set -uo pipefail
t0=$(date +%s)
parts="${*:-1 2 3 4}"
for p in $parts; do
    case "$p" in
        1 | 2 | 3 | 4 | 5 | 6) ;;
        *) echo "bench-gpu: unknown part \`$p\`; the parts are 1-6"; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
DEV="${UPCC_BENCH_DEVICE:-cuda}"
if [ "$DEV" = cuda ] && [ ! -e /proc/driver/nvidia/version ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "bench-gpu: no GPU, nothing measured"
    exit 1
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
UPCC="${UPCC_BIN:-gpu/bin/upcc}"
AE_STEP="$(dirname "$UPCC")/ae_step"
work="${UPCC_GPU_WORK:-$(mktemp -d)}"
mkdir -p "$work"
limit="${UPCC_PART_SECONDS:-570}"
deadline="${UPCC_GPU_DEADLINE:-560}"
py=python3
export UPCC AE_STEP UPCC_DEV="$DEV" work py

# store spec selectors...: runs the nodes, then one JSON line per executed node with its
# timings (from the manifests), and the total.
nodes_json() {
    local store=$1 spec=$2 dev=$3
    shift 3
    "$UPCC" --store "$store" --device "$dev" run "$spec" "$@" --json --progress none > "$work/run.json" || return 1
    $py - "$UPCC" "$store" "$spec" "$work/run.json" "$dev" "$@" <<'PY'
import json, subprocess, sys
upcc, store, spec, path, dev = sys.argv[1:6]
rest = sys.argv[6:]
sets = [a for i, a in enumerate(rest) if a == "--set" or (i > 0 and rest[i - 1] == "--set")]
run = json.load(open(path))
for n in run["nodes"]:
    if n["outcome"] != "executed":
        continue
    p = subprocess.run([upcc, "--store", store, "--device", dev, "explain", spec, n["id"], "--json", *sets],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"explain {n['id']} failed: {p.stderr}")
    m = json.loads(p.stdout)["manifest"]
    s = {k: round(v, 4) for k, v in m["summary"].items() if k.startswith("seconds")}
    print(json.dumps({"node": n["id"], "wall_s": round(n["duration_s"], 2), **s}))
print(json.dumps({"total_s": round(run["seconds"], 2), "nodes_executed": run["executed"],
                  "device": run.get("device"), "numerics": run.get("numerics")}))
PY
}

# The ECI-PP cell on a tenth of the paper's epoch budget, then the extrapolation: the SDAE's
# wall time × 10 (same mix of layer-wise and fine-tuning epochs), ECI-PP's seconds per epoch ×
# 500, and the other nodes (experts, constraints, k-means) as they were.
cell_json() {
    local store="$work/cell"
    nodes_json "$store" experiments/mnist5k-eci-cell.yaml "$UPCC_DEV" \
        --set pretrain.layerwise_epochs=30 --set pretrain.finetune_epochs=50 \
        --set train.epochs=50 --set eci.warmup_epochs=5 | tee "$work/cell.jsonl" || return 1
    $py - "$work/cell.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
nodes = [r for r in rows if "node" in r]
pre = sum(r["wall_s"] for r in nodes if r["node"].startswith("pretrain/"))
eci = [r for r in nodes if r["node"].startswith("train/") and "seconds_per_epoch" in r]
if not eci:
    sys.exit("no ECI-PP training node was computed (a warm store? use a fresh UPCC_GPU_WORK)")
per_epoch = eci[0]["seconds_per_epoch"]
other = sum(r["wall_s"] for r in nodes if not r["node"].startswith(("pretrain/", "train/")))
print(json.dumps({"bench": "eci cell, paper settings (extrapolated)", "sdae_s_measured": round(pre, 1),
                  "eci_s_per_epoch": round(per_epoch, 3), "other_s": round(other, 1),
                  "cell_s_extrapolated": round(pre * 10 + per_epoch * 500 + other, 1),
                  "epochs_measured": "SDAE 30x4 + 50, ECI-PP 50 (5 warm-up)",
                  "epochs_extrapolated": "SDAE 300x4 + 500, ECI-PP 500 (50 warm-up)"}))
PY
}

# label device [runner...]: the smoke spec from a fresh store, its wall time as one JSON line.
smoke_json() {
    local label=$1 dev=$2
    shift 2
    local store="$work/smoke-$label"
    rm -rf "$store"
    local start end
    start=$(date +%s.%N)
    "$@" "$UPCC" --store "$store" --device "$dev" run experiments/smoke.yaml --progress none > /dev/null || return 1
    end=$(date +%s.%N)
    $py -c "import sys; print('{\"bench\":\"smoke run\",\"runner\":\"$label\",\"device\":\"$dev\",\"wall_s\":%.1f}' % ($end - $start))"
}

part() {
    case "$1" in
        1)
            DEVICE="$UPCC_DEV" "$AE_STEP" 256 1024 || return 1
            if $py -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
                $py stages/nn/benches/torch_gpu.py || return 1
            else
                echo '{"impl":"pytorch","note":"PyTorch with CUDA is not importable here; see ../shared/reference/gpu-machine.md for its figures on this GPU"}'
            fi
            ;;
        2) nodes_json "$work/epochs" experiments/smoke.yaml "$UPCC_DEV" target=eci supervision=multi3 \
               method=probpair,eci-pp trial=1 --set constraints.budget=9000 ;;
        3) cell_json ;;
        4) smoke_json "$UPCC_DEV" "$UPCC_DEV" ;;
        5) smoke_json "cpu-$(nproc)-cores" cpu ;;
        6) smoke_json cpu-2-cores cpu taskset -c 0,1 env UPCC_THREADS=2 ;;
    esac
}
export -f part nodes_json smoke_json cell_json
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
out_log="${OUT:+$OUT/bench-gpu.log}"
[ -n "$out_log" ] && : > "$out_log"
say() {
    echo "$1"
    [ -n "$out_log" ] && echo "$1" >> "$out_log"
    return 0
}
status=0
summary=""
for p in $parts; do
    say "== bench-gpu part $p"
    left=$(( deadline - ($(date +%s) - t0) - 15 ))
    if [ "$left" -lt 20 ]; then
        line="SKIP part $p: no time left (UPCC_GPU_DEADLINE=${deadline} s)"
        status=1
        say "$line"
        summary="$summary$line"$'\n'
        continue
    fi
    budget=$(( left < limit ? left : limit ))
    log="$work/part-$p.out"
    start=$(date +%s)
    timeout --signal=TERM --kill-after=10 "$budget" bash -c 'part "$0"' "$p" > "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    if [ "$rc" -eq 0 ]; then
        cat "$log"
        [ -n "$out_log" ] && cat "$log" >> "$out_log"
        line="PASS part $p (${secs} s)"
    else
        # No figures from a part that failed: only its log, marked.
        sed 's/^/  | /' "$log" | tail -n 40
        [ -n "$out_log" ] && sed 's/^/  | /' "$log" >> "$out_log"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            line="FAIL part $p: stopped after ${budget} s (UPCC_PART_SECONDS / UPCC_GPU_DEADLINE)"
        else
            line="FAIL part $p (exit $rc, ${secs} s)"
        fi
        status=1
    fi
    say "$line"
    summary="$summary$line"$'\n'
done
say "== bench-gpu summary"
printf '%s' "$summary"
[ -n "$out_log" ] && printf '%s' "$summary" >> "$out_log"
exit "$status"
