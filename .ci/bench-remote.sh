#!/usr/bin/env bash
# A slow bucket's cost to a run (README, Remote cache): a local S3 server (moto) behind a proxy
# that holds every request DELAY seconds; a 7-node spec computed and uploaded by one store, then
# downloaded by a fresh one. Prints wall times and the requests the proxy saw.
#
#   bash .ci/bench-remote.sh [UPCC_BINARY] [DELAY_S]      (PYTHON: a python with moto[server])
set -euo pipefail
cd "$(dirname "$0")/.."
upcc="$(realpath "${1:-${CARGO_TARGET_DIR:-target}/release/upcc}")"
delay="${2:-1}"
py="${PYTHON:-${UPCC_TEST_PYTHON:-/var/tmp/upcc-ci-venv/bin/python}}"
[ -x "$upcc" ] || { echo "error: no upcc binary at $upcc (cargo build --release)" >&2; exit 2; }
"$py" -c "import moto.server" 2>/dev/null || { echo "error: $py has no moto (pip install 'moto[server]'), set PYTHON" >&2; exit 2; }
work="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
port=$((20000 + RANDOM % 20000)); proxy=$((port + 1))
"$py" -m moto.server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
curl -s -X PUT "http://127.0.0.1:$port/bench" -o /dev/null
"$py" .ci/slow_proxy.py "$proxy" "$port" "$delay" & pids+=($!)
sleep 0.5
"$py" - "$work/data.csv" <<'PY'
import random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for i in range(96):
        c = i % 3
        f.write(",".join(f"{random.gauss(c, 0.6):.3f}" for _ in range(5)) + f",{c}\n")
PY
cat > "$work/mini.yaml" <<'YAML'
name: mini
datasets:
  d:
    format: csv
    files: {data: data.csv}
    label_column: last
    header: "no"
    split: {kind: stratified, test_fraction: 0.2, seed: 0}
    n_classes: 3
    embedding_dim: 3
supervision:
  lv: {kind: single, level: 0.5}
methods:
  probpair: {}
trials: [1]
params:
  constraints: {budget: 100, corruption: 0.3}
  train: {epochs: 2, hidden: [16]}
  cluster: {n_init: 2}
  pretrain: {layerwise_epochs: 1, finetune_epochs: 1, hidden: [16]}
  expert: {hidden: [16], max_epochs: 5}
targets:
  main: {grid: {dataset: [d], supervision: [lv], method: [probpair], pretrain: [false]}}
YAML
export HOME="$work/home" AWS_ENDPOINT_URL="http://127.0.0.1:$proxy" AWS_ACCESS_KEY_ID=bench \
    AWS_SECRET_ACCESS_KEY=bench AWS_DEFAULT_REGION=us-east-1 AWS_ALLOW_HTTP=true
mkdir -p "$HOME"
"$upcc" key generate --name bench >/dev/null 2>&1
timed() {  # timed LABEL ARGS...: one run, its wall time and summary
    local label=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    (cd "$work" && "$upcc" "$@" >/dev/null 2>"$work/err") || { cat "$work/err" >&2; exit 1; }
    t1=$(date +%s.%N)
    printf '%-34s %6.1f s   %s\n' "$label" "$(echo "$t1 - $t0" | bc)" "$(grep -E '^upcc: [0-9]+ nodes:' "$work/err" | sed 's/^upcc: //')"
}
echo "== every request held ${delay} s"
timed "no remote (compute only)" run mini.yaml --store "$work/s0" --progress none
timed "compute + upload" run mini.yaml --store "$work/s1" --remote s3://bench/p --progress plain
timed "fresh store: download" run mini.yaml --store "$work/s2" --remote s3://bench/p --progress plain
