#!/usr/bin/env bash
# Build the soft GPU into DIR: a CPU implementation of the part of the CUDA driver API and cuBLAS
# that upcc calls, as libcuda.so.1 and libcublas.so.13 (with their libcuda.so / libcublas.so
# names), running upcc's own kernels (stages/nn/src/cuda_kernels.cu compiled for the host). Put
# DIR first on LD_LIBRARY_PATH, with a real NVRTC (the PyPI wheel nvidia-cuda-nvrtc) beside it,
# and cudarc loads it: the real `Cuda` backend runs unchanged, on the CPU, under memcheck,
# racecheck, synccheck and streamcheck (stages/nn/soft-gpu/README.md).
#
#   bash .ci/soft-gpu.sh DIR      needs g++ (C++17), python3 and Boost.Context's headers and
#                                 library (Debian: libboost-context-dev)
#
# DIR/kernel-source.cu is the kernel source it was built from: the tests refuse a soft GPU built
# from another one (rebuild after changing the kernels; it takes about a minute).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: bash .ci/soft-gpu.sh DIR}"
src="$root/stages/nn/soft-gpu"
cxx="${CXX:-g++}"
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "soft-gpu: no C++ compiler ($cxx); install g++" >&2
    exit 1
fi
if ! echo '#include <boost/context/fiber.hpp>' | "$cxx" -std=c++17 -x c++ -fsyntax-only - 2>/dev/null; then
    echo "soft-gpu: Boost.Context's headers are missing; install them (Debian: apt-get install libboost-context-dev)" >&2
    exit 1
fi
mkdir -p "$out/obj"
out="$(cd "$out" && pwd)"
python3 "$src/gen_kernels.py" "$root" "$out/obj/kernels.gen.cpp"
# -march=native: the soft GPU runs where it is built (its vector products use the host's widest
# registers); -ffp-contract=off keeps every sum in the order the source writes it.
flags=(-std=c++17 -O2 -march=native -g -fPIC -fvisibility=hidden -ffp-contract=off -Wall -Wextra
    -Wno-unused-parameter -I"$src")
objs=()
pids=()
for f in driver cubin launch; do
    "$cxx" "${flags[@]}" -c "$src/$f.cpp" -o "$out/obj/$f.o" &
    pids+=($!)
    objs+=("$out/obj/$f.o")
done
"$cxx" "${flags[@]}" -Wno-unused-variable -c "$out/obj/kernels.gen.cpp" -o "$out/obj/kernels.o"
objs+=("$out/obj/kernels.o")
for p in "${pids[@]}"; do wait "$p"; done
# Boost.Context linked in when its static library allows, so DIR needs nothing beside it.
if ! "$cxx" -shared -o "$out/libcuda.so.1" -Wl,-soname,libcuda.so.1 -Wl,--no-undefined "${objs[@]}" \
    -Wl,-Bstatic -lboost_context -Wl,-Bdynamic -lpthread 2>/dev/null; then
    "$cxx" -shared -o "$out/libcuda.so.1" -Wl,-soname,libcuda.so.1 -Wl,--no-undefined "${objs[@]}" \
        -lboost_context -lpthread
fi
ln -sf libcuda.so.1 "$out/libcuda.so"
"$cxx" "${flags[@]}" -shared -o "$out/libcublas.so.13" -Wl,-soname,libcublas.so.13 -Wl,--no-undefined \
    "$src/cublas.cpp" -L"$out" -l:libcuda.so.1 -Wl,-rpath,'$ORIGIN' -lpthread
ln -sf libcublas.so.13 "$out/libcublas.so"
cp "$root/stages/nn/src/cuda_kernels.cu" "$out/kernel-source.cu"
echo "soft-gpu: built $out (libcuda.so.1, libcublas.so.13); use it with"
echo "  LD_LIBRARY_PATH=$out:<NVRTC's lib directory>:\$LD_LIBRARY_PATH"
