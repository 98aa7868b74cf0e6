#!/usr/bin/env bash
# Figures of the Slurm executor (README, On a Slurm cluster): the job plans of the paper spec and
# the smoke spec (`run --dry-run`, no cluster needed), then, on a cluster that answers `sinfo`
# (CI's: `bash .ci/slurm.sh up`), the smoke spec at small sizes run locally and through Slurm
# workers on the same machine, with wall times, jobs submitted and the most queued at once.
#
#   bash .ci/bench-slurm.sh [UPCC_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
upcc="${1:-${CARGO_TARGET_DIR:-target}/release/upcc}"
[ -x "$upcc" ] || { echo "error: no upcc binary at $upcc (cargo build --release)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
small=(--set 'pretrain.hidden=[64,64,256]' --set 'train.hidden=[64,64,256]' --set expert.max_epochs=10
    --set pretrain.layerwise_epochs=5 --set pretrain.finetune_epochs=10 --set train.epochs=5
    --set methods.eci-pp.train.epochs=3 --set methods.eci-pp.eci.warmup_epochs=1 --set eci.folds=2
    --set eci.corrector_epochs=5 --set constraints.budget=1000 --set cluster.n_init=10)

plan() {
    "$upcc" --store "$work/none" run "$@" --executor slurm --dry-run --json 2>/dev/null \
        | python3 -c 'import json,sys; j=json.load(sys.stdin); print(json.dumps({"spec": sys.argv[1], "nodes": j["nodes"], "one_job_per_node": j["nodes"], "worker_jobs": j["jobs"], "waves": max([w["wave"] for w in j["waves"]] or [0]), "peak_queued": j["peak_queued"]}))' "$1"
}
echo "== job plans on a fresh store (default executor settings)"
plan experiments/paper.yaml
plan smoke
if ! sinfo -h -o %T >/dev/null 2>&1; then
    echo "(no Slurm cluster answers: the wall-time comparison needs one, e.g. bash .ci/slurm.sh up)"
    exit 0
fi
cat > "$work/config.yaml" <<'YAML'
executor:
  slurm:
    poll_seconds: 1
    linger_seconds: 5
    workers: {training: 2, other: 1}
    resources:
      training: {cpus: 1}
      default: {mem_mb: 2000}
YAML
echo "== the smoke spec at small sizes: local ($(nproc) threads) and through Slurm workers, same machine"
start=$(date +%s.%N)
"$upcc" --store "$work/local" run smoke "${small[@]}" --progress none > /dev/null 2>&1
local_s=$(echo "$(date +%s.%N) - $start" | bc)
start=$(date +%s.%N)
UPCC_CONFIG="$work/config.yaml" "$upcc" --store "$work/slurm" run smoke "${small[@]}" --executor slurm \
    --progress none --json 2>/dev/null > "$work/slurm.json"
slurm_s=$(echo "$(date +%s.%N) - $start" | bc)
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(json.dumps({"bench": "smoke (small sizes)", "local_wall_s": round(float(sys.argv[2]), 1), "slurm_wall_s": round(float(sys.argv[3]), 1), "nodes": j["total"], "worker_jobs": j["submitted"], "peak_queued": j["peak_queued"], "failed": j["failed"]}))' \
    "$work/slurm.json" "$local_s" "$slurm_s"
