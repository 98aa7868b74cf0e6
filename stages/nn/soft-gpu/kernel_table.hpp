// Included by the generated kernels.gen.cpp after the kernels: turns each kernel function into a
// KernelDef (its parameters and a launcher that unpacks a launch's parameter bytes into the
// kernel's argument types, device addresses into checked pointers).
#pragma once
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "softgpu.hpp"

namespace sg {

/// A pointer parameter resolved against the allocations: storage, element offset, length in
/// elements (0 when the address is in no usable allocation: every access is then reported).
struct Resolved {
    char* data = nullptr;
    int64_t off = 0;
    int64_t len = 0;
    Alloc* alloc = nullptr;
    uint64_t* shadow = nullptr;
    uint64_t base = 0;
    bool ok = true;
};
Resolved resolve_pointer(LaunchArgs& launch, size_t param, uint64_t addr, size_t elem_size);
/// Run every block and thread of a launch: `body(arg)` is one CUDA thread.
CUresult execute(LaunchArgs& launch, void (*body)(void*), void* arg);

template <class A>
ParamInfo param_info() {
    if constexpr (is_dptr<A>::value) {
        return ParamInfo{8, true, std::is_const_v<typename A::elem>};
    } else {
        static_assert(std::is_arithmetic_v<A>, "kernel parameters are pointers or scalars");
        return ParamInfo{(uint32_t)sizeof(A), false, false};
    }
}

template <class A>
A unpack_param(LaunchArgs& launch, size_t i, bool& ok) {
    const std::vector<char>& bytes = launch.params[i];
    if constexpr (is_dptr<A>::value) {
        using T = typename A::elem;
        uint64_t addr = 0;
        memcpy(&addr, bytes.data(), sizeof addr);
        Resolved r = resolve_pointer(launch, i, addr, sizeof(T));
        ok = ok && r.ok;
        return A(reinterpret_cast<T*>(r.data), r.off, r.len, r.alloc, r.shadow, r.base, (int)i);
    } else {
        A v{};
        memcpy(&v, bytes.data(), sizeof v);
        return v;
    }
}

template <class... A, size_t... I>
std::tuple<A...> unpack_all(LaunchArgs& launch, bool& ok, std::index_sequence<I...>) {
    // Braced initialisation evaluates the parameters in order.
    return std::tuple<A...>{unpack_param<A>(launch, I, ok)...};
}

template <class Tuple, auto Fn>
void call_kernel(void* args) {
    std::apply(Fn, *static_cast<Tuple*>(args));
}

template <class F, F Fn>
struct Kernel;

template <class... A, void (*Fn)(A...)>
struct Kernel<void (*)(A...), Fn> {
    static CUresult run(LaunchArgs& launch) {
        bool ok = true;
        auto args = unpack_all<A...>(launch, ok, std::index_sequence_for<A...>{});
        if (!ok) return launch.problem_code;
        return execute(launch, &call_kernel<std::tuple<A...>, Fn>, &args);
    }
    static std::vector<ParamInfo> params() { return {param_info<A>()...}; }
};

template <class F, F Fn>
KernelDef make_kernel(const char* name, bool barriers, std::vector<const char*> names) {
    return KernelDef{name, barriers, Kernel<F, Fn>::params(), std::move(names), &Kernel<F, Fn>::run};
}

} // namespace sg
