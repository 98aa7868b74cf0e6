#!/usr/bin/env bash
# The GPU suite, run on a machine with an NVIDIA GPU from the binaries .ci/gpu-build.sh put
# into gpu/bin (the GPU machine has no Rust toolchain and no `just`). Parts:
#   device    `upcc --device cuda device`: probe the GPU, compile and load the kernels (seconds)
#   ops       every Device op on CUDA against the CPU, forward and backward; a training step;
#             bitwise reruns on the GPU; the numerics class and facts (seconds)
#   sanitize  the ops under compute-sanitizer's memcheck, racecheck and synccheck (a minute or
#             two): the only check of races between blocks and of the real device's accesses
#   cells     ProbPair and ECI-PP smoke cells on the GPU and on the CPU: per-cell test NMI and
#             the mean difference within the bound rounding alone gives (tests/gpu/e2e.py); a
#             forced rerun on the GPU reproduces every byte (a few minutes)
#   smoke     the whole smoke spec with --device cuda (a few minutes)
# `bash .ci/gpu-test.sh` runs them all in order; `bash .ci/gpu-test.sh ops cells` runs those.
# One deadline covers the whole call (UPCC_GPU_DEADLINE seconds from the start, default 560:
# inside the device tool's 10 minutes, so the summary always prints): each part gets what is
# left of it (at most UPCC_PART_SECONDS), and a part with too little left is skipped, saying
# so. Each part prints PASS, FAIL or SKIP with its time; the script exits non-zero if any part
# failed or was not run. Everything it prints also goes to one file, $OUT/gpu-test.log, when
# $OUT is set (the device tool returns at most 8 files). Without a GPU it says so and fails: it
# never passes silently.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
all="device ops sanitize cells smoke"
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
limit="${UPCC_PART_SECONDS:-570}"
deadline="${UPCC_GPU_DEADLINE:-560}"
work="${UPCC_GPU_WORK:-$(mktemp -d)}"
mkdir -p "$work"
# compute-sanitizer: on the PATH or in a CUDA toolkit's bin.
sanitizer() {
    command -v compute-sanitizer 2>/dev/null && return 0
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin /usr/local/cuda*/bin; do
        [ -x "$d/compute-sanitizer" ] && { echo "$d/compute-sanitizer"; return 0; }
    done
    return 1
}
run_part() {
    case "$1" in
        device) "$bin/upcc" --device cuda device ;;
        ops) "$bin/cuda_ops" --ignored --test-threads=1 --nocapture ;;
        sanitize)
            cs=$(sanitizer) || { echo "compute-sanitizer not found (it is in the CUDA toolkit's bin/)"; return 1; }
            for tool in memcheck racecheck synccheck; do
                echo "-- compute-sanitizer --tool $tool"
                "$cs" --tool "$tool" --error-exitcode 9 "$bin/cuda_ops" --ignored --test-threads=1 || return 1
            done
            ;;
        cells) python3 tests/gpu/e2e.py "$bin/upcc" "$work" cells ;;
        smoke) python3 tests/gpu/e2e.py "$bin/upcc" "$work" smoke ;;
    esac
}
export -f run_part sanitizer
export bin work
log="${OUT:+$OUT/gpu-test.log}"
[ -n "$log" ] && : > "$log"
say() {
    echo "$1"
    [ -n "$log" ] && echo "$1" >> "$log"
    return 0
}
status=0
summary=""
for p in $parts; do
    say "== gpu-test $p"
    # What is left of the deadline, less 15 s for the summary and the part's own stop.
    left=$(( deadline - ($(date +%s) - t0) - 15 ))
    if [ "$left" -lt 20 ]; then
        line="SKIP $p: no time left (UPCC_GPU_DEADLINE=${deadline} s)"
        status=1
        say "$line"
        summary="$summary$line"$'\n'
        continue
    fi
    budget=$(( left < limit ? left : limit ))
    start=$(date +%s)
    if [ -n "$log" ]; then
        timeout --signal=TERM --kill-after=10 "$budget" bash -c 'run_part "$0"' "$p" 2>&1 | tee -a "$log"
        rc=${PIPESTATUS[0]}
    else
        timeout --signal=TERM --kill-after=10 "$budget" bash -c 'run_part "$0"' "$p"
        rc=$?
    fi
    secs=$(( $(date +%s) - start ))
    if [ "$rc" -eq 0 ]; then
        line="PASS $p (${secs} s)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        line="FAIL $p: stopped after ${budget} s (UPCC_PART_SECONDS / UPCC_GPU_DEADLINE)"
        status=1
    else
        line="FAIL $p (exit $rc, ${secs} s)"
        status=1
    fi
    say "$line"
    summary="$summary$line"$'\n'
done
say "== gpu-test summary"
printf '%s' "$summary"
[ -n "$log" ] && printf '%s' "$summary" >> "$log"
if [ "$status" -eq 0 ]; then say "gpu-test: passed"; else say "gpu-test: FAILED"; fi
exit "$status"
