// The header `cuda_kernels.cu` is compiled behind for the host: what CUDA C++ gives a kernel
// (threadIdx, blockIdx, blockDim, gridDim, __syncthreads, __shared__, the math functions) and
// the checked pointer every `T*` of the kernel source becomes (gen_kernels.py rewrites the
// pointer types and nothing else, so the lines of the file are the lines of the source).
//
// A kernel's pointer parameters arrive as device addresses; each becomes a `dptr<T>` that knows
// its allocation, so every access is checked against the allocation's bounds (memcheck), and a
// write or read of a word another thread of the same launch wrote without a barrier between is
// reported (racecheck). A bad access is reported once, reads 0 and writes nowhere, and fails
// the launch with a sticky CUDA_ERROR_ILLEGAL_ADDRESS, as a real GPU's fault does.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace sg {

struct Alloc;

struct KDim {
    unsigned x, y, z;
};

/// One CUDA thread of the running block.
struct KThread {
    KDim idx;
    uint32_t linear;     // index in the block
    uint64_t tag;        // racecheck: launch << 32 | thread in the launch (24 bits) << 8
    int barrier_line;    // the __syncthreads it waits at (0: none)
    bool at_barrier;
    bool done;
    void* fiber;         // kernels.cpp's fiber state
};

/// The launch running now (one at a time: execution holds the soft GPU's lock).
struct KRun {
    const char* kernel;
    KDim grid, block, block_idx;
    uint64_t block_linear;
    uint32_t threads; // per block
    uint32_t launch_no;
    bool fibers;      // barrier kernel: each thread runs on a fiber
    uint32_t phase;   // barriers the block has passed (all its threads together)
    KThread* cur;
};
extern KRun* g_run;

enum AccessKind : int { READ = 0, WRITE = 1, RMW = 2 };

/// Report a bad access through a checked pointer; returns scratch storage for it.
void* bad_access(const Alloc* a, uint64_t addr, const void* base, int64_t index, int64_t len,
                 size_t size, int param, int kind);
/// Racecheck: `word`'s last writer (`seen`, a tag) is another thread of this launch: report a
/// race unless a barrier of their block separates them.
void race_found(Alloc* a, int64_t offset, uint64_t seen, int kind);
/// __syncthreads at source line `line`.
void sync_threads(int line);

/// A kernel's `T*`: the allocation's storage (`data`, element 0 at the allocation's start),
/// this pointer's element offset in it, the allocation's length in elements, and which kernel
/// parameter it came from (-1: a __shared__ array).
template <class T>
struct dref;

template <class T>
struct dptr {
    using elem = T;
    T* data = nullptr;
    int64_t off = 0;
    int64_t len = 0;
    Alloc* alloc = nullptr;
    uint64_t* shadow = nullptr; // racecheck words, when this launch writes the allocation
    uint64_t addr = 0;          // device address of element 0 (the allocation's start)
    int param = -1;

    dptr() = default;
    dptr(T* d, int64_t o, int64_t l, Alloc* a, uint64_t* sh, uint64_t ad, int p)
        : data(d), off(o), len(l), alloc(a), shadow(sh), addr(ad), param(p) {}
    /// A __shared__ array decays to a checked pointer over exactly its elements.
    template <size_t N>
    dptr(T (&a)[N]) : data(a), off(0), len((int64_t)N) {}
    /// `float*` converts to `const float*`.
    template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
    dptr(const dptr<U>& o)
        : data(o.data), off(o.off), len(o.len), alloc(o.alloc), shadow(o.shadow), addr(o.addr), param(o.param) {}

    T& at(int64_t i, int kind) const {
        int64_t k = off + i;
        if (__builtin_expect((uint64_t)k >= (uint64_t)len, 0)) {
            return *static_cast<T*>(bad_access(alloc, addr, data, k, len, sizeof(T), param, kind));
        }
        if (shadow != nullptr) {
            int64_t byte = k * (int64_t)sizeof(T);
            uint64_t& w = shadow[byte >> 2];
            uint64_t me = g_run->cur->tag | (g_run->phase & 0xff);
            uint64_t x = w ^ me;
            // Same launch, another thread: maybe a race.
            if (__builtin_expect((x >> 32) == 0 && (x & 0xFFFFFF00u) != 0, 0)) race_found(alloc, byte, w, kind);
            if (kind != READ) w = me;
        }
        return data[k];
    }

    dptr operator+(int64_t n) const { return dptr(data, off + n, len, alloc, shadow, addr, param); }
    dptr operator-(int64_t n) const { return dptr(data, off - n, len, alloc, shadow, addr, param); }
    dptr& operator+=(int64_t n) { off += n; return *this; }
    dptr& operator-=(int64_t n) { off -= n; return *this; }

    /// `const T*`: a read. `T*`: a reference that knows whether it is read or written.
    decltype(auto) operator[](int64_t i) const {
        if constexpr (std::is_const_v<T>) {
            return static_cast<const T&>(at(i, READ));
        } else {
            return dref<T>{*this, i};
        }
    }
    decltype(auto) operator*() const { return (*this)[0]; }
};

/// A `T&` through a checked pointer that knows whether it is read or written.
template <class T>
struct dref {
    dptr<T> p;
    int64_t i;
    operator T() const { return p.at(i, READ); }
    dref& operator=(T v) { p.at(i, WRITE) = v; return *this; }
    dref& operator=(const dref& o) { T v = o; p.at(i, WRITE) = v; return *this; }
    dref& operator+=(T v) { p.at(i, RMW) += v; return *this; }
    dref& operator-=(T v) { p.at(i, RMW) -= v; return *this; }
    dref& operator*=(T v) { p.at(i, RMW) *= v; return *this; }
    dref& operator/=(T v) { p.at(i, RMW) /= v; return *this; }
};

template <class T>
struct is_dptr : std::false_type {};
template <class T>
struct is_dptr<dptr<T>> : std::true_type {};

} // namespace sg

#define __global__
#define __device__
// One block runs at a time, on one host thread: a block's shared memory is a static.
#define __shared__ static
#define threadIdx (::sg::g_run->cur->idx)
#define blockIdx (::sg::g_run->block_idx)
#define blockDim (::sg::g_run->block)
#define gridDim (::sg::g_run->grid)
#define __syncthreads() ::sg::sync_threads(__LINE__)

inline double __longlong_as_double(long long v) {
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}
