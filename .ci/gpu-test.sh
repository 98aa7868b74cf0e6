#!/usr/bin/env bash
# The GPU suite (`just gpu-test`), run on a machine with an NVIDIA GPU from the binaries that
# .ci/gpu-build.sh put into gpu/bin. Without a GPU it says so and fails: it never passes
# silently.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -e /proc/driver/nvidia/version ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-test: no GPU, 0 run"
    exit 1
fi
for b in upcc cuda_ops; do
    if [ ! -x "gpu/bin/$b" ]; then
        echo "gpu-test: gpu/bin/$b missing; run bash .ci/gpu-build.sh on the build machine and carry gpu/"
        exit 1
    fi
done
# cudarc loads cuBLAS and NVRTC at run time; find them where the CUDA toolkit keeps them.
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
echo "== every Device op on CUDA against the CPU, forward and backward; bitwise reruns"
gpu/bin/cuda_ops --ignored --test-threads=1 --nocapture || status=1
echo "== end to end: smoke cells GPU vs CPU, forced reruns, the smoke spec with --device cuda"
work="${UPCC_GPU_WORK:-$(mktemp -d)}"
python3 tests/gpu/e2e.py gpu/bin/upcc "$work" || status=1
if [ "$status" -eq 0 ]; then echo "gpu-test: passed"; else echo "gpu-test: FAILED"; fi
exit "$status"
