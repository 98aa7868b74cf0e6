#!/usr/bin/env bash
# The GPU suite, run on a machine with an NVIDIA GPU from the binaries .ci/gpu-build.sh put
# into gpu/bin (the GPU machine has no Rust toolchain and no `just`). Parts, each well inside
# the 10 minutes one device command may take on one H100:
#   device  `upcc --device cuda device`: probe the GPU, compile and load the kernels (seconds)
#   ops     every Device op on CUDA against the CPU, forward and backward; a training step;
#           bitwise reruns on the GPU; the numerics class and facts (seconds)
#   cells   ProbPair and ECI-PP smoke cells on the GPU and on the CPU: test NMI within 1.5
#           points; a forced rerun on the GPU reproduces every byte (a few minutes)
#   smoke   the whole smoke spec with --device cuda (a few minutes)
# `bash .ci/gpu-test.sh` runs them all in order; `bash .ci/gpu-test.sh ops cells` runs those.
# Each part prints PASS or FAIL with its time; the script exits non-zero if any part failed
# or was not run. Logs go to $OUT/gpu-test-PART.log when $OUT is set (the device tool's output
# folder). Without a GPU it says so and fails: it never passes silently.
set -uo pipefail
cd "$(dirname "$0")/.."
all="device ops cells smoke"
parts="${*:-$all}"
for p in $parts; do
    case " $all " in
        *" $p "*) ;;
        *) echo "gpu-test: unknown part \`$p\`; the parts are: $all"; exit 2 ;;
    esac
done
bin="${UPCC_GPU_BIN:-gpu/bin}"
# (UPCC_GPU_TEST_ASSUME_GPU=1 skips this check: the script's own test runs it with stand-in
# binaries on a machine without a GPU.)
if [ -z "${UPCC_GPU_TEST_ASSUME_GPU:-}" ] && [ ! -e /proc/driver/nvidia/version ] \
    && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-test: no GPU, 0 run"
    exit 1
fi
for b in upcc cuda_ops; do
    if [ ! -x "$bin/$b" ]; then
        echo "gpu-test: $bin/$b missing; run bash .ci/gpu-build.sh on the build machine and carry gpu/"
        exit 1
    fi
done
# cudarc loads cuBLAS and NVRTC at run time; find them where the CUDA toolkit keeps them.
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Each part stops itself before the device tool's 10-minute limit, so the summary prints.
limit="${UPCC_PART_SECONDS:-570}"
work="${UPCC_GPU_WORK:-$(mktemp -d)}"
mkdir -p "$work"
run_part() {
    case "$1" in
        device) "$bin/upcc" --device cuda device ;;
        ops) "$bin/cuda_ops" --ignored --test-threads=1 --nocapture ;;
        cells) python3 tests/gpu/e2e.py "$bin/upcc" "$work" cells ;;
        smoke) python3 tests/gpu/e2e.py "$bin/upcc" "$work" smoke ;;
    esac
}
export -f run_part
export bin work
status=0
summary=""
for p in $parts; do
    echo "== gpu-test $p"
    log="${OUT:+$OUT/gpu-test-$p.log}"
    start=$(date +%s)
    if [ -n "$log" ]; then
        timeout --signal=TERM --kill-after=10 "$limit" bash -c 'run_part "$0"' "$p" 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
    else
        timeout --signal=TERM --kill-after=10 "$limit" bash -c 'run_part "$0"' "$p"
        rc=$?
    fi
    secs=$(( $(date +%s) - start ))
    if [ "$rc" -eq 0 ]; then
        line="PASS $p (${secs} s)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        line="FAIL $p: stopped after ${limit} s (UPCC_PART_SECONDS)"
        status=1
    else
        line="FAIL $p (exit $rc, ${secs} s)"
        status=1
    fi
    echo "$line"
    summary="$summary$line"$'\n'
done
echo "== gpu-test summary"
printf '%s' "$summary"
if [ "$status" -eq 0 ]; then echo "gpu-test: passed"; else echo "gpu-test: FAILED"; fi
exit "$status"
