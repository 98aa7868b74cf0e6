// The soft GPU's cuBLAS: the handle calls upcc makes and cublasSgemm_v2 as a column-major
// reference that holds every call to the BLAS argument rules — m, n, k not negative; lda at
// least max(1, rows of A as stored), ldb likewise, ldc at least max(1, m); C overlapping
// neither A nor B — and refuses a call that breaks one with CUBLAS_STATUS_INVALID_VALUE, naming
// the parameter as reference BLAS's xerbla does. With beta = 0, C is written without being read
// (a NaN left in C does not leak into the product). The product is queued on the handle's
// stream like a kernel; when it runs, the stored extent of A, B and C (lda × columns) is checked
// against their allocations (memcheck).
//
// A separate library (libcublas.so.13) that links to the soft driver, as cuBLAS links to
// NVIDIA's: both see one set of contexts, streams and allocations.
#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>
#include <vector>

#include "softgpu.hpp"

using namespace sg;

namespace {

struct Handle {
    Context* ctx = nullptr;
    uint64_t generation = 0;
    CUstream stream = nullptr;
    int math = CUBLAS_DEFAULT_MATH;
    int pointer_mode = CUBLAS_POINTER_MODE_HOST;
};
std::set<Handle*> g_handles;

cublasStatus_t refuse(cublasStatus_t status, const std::string& why) {
    report("cuBLAS: " + why);
    return status;
}

Handle* handle_of(cublasHandle_t h, const char* api, cublasStatus_t* status) {
    Handle* x = reinterpret_cast<Handle*>(h);
    if (h == nullptr || g_handles.count(x) == 0) {
        *status = refuse(CUBLAS_STATUS_NOT_INITIALIZED, std::string(api) + ": not a live cuBLAS handle");
        return nullptr;
    }
    if (!x->ctx->active || x->ctx->generation != x->generation) {
        *status = refuse(CUBLAS_STATUS_NOT_INITIALIZED,
                         std::string(api) + ": the handle's context (cuda:" + std::to_string(x->ctx->device) +
                             ") was destroyed");
        return nullptr;
    }
    return x;
}

/// Column-major C = alpha·op(A)·op(B) + beta·C in f32. op(A) is packed row by row and op(B)
/// column by column, so every C(i, j) is a dot product of two contiguous k-vectors, summed in
/// eight interleaved partial sums (a fixed order: the same bits on every run), two rows by four
/// columns at a time.
typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum(v8 v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
    size_t K = (size_t)k;
    // Pad k to a multiple of 8 with zeros: every dot product is whole vectors.
    size_t kp = (K + 7) / 8 * 8;
    std::vector<float> a((size_t)m * kp, 0.0f), b((size_t)n * kp, 0.0f), dot((size_t)m * (size_t)n);
    for (int i = 0; i < m; i++) {
        for (size_t p = 0; p < K; p++) a[(size_t)i * kp + p] = ta ? A[p + (size_t)i * lda] : A[i + p * lda];
    }
    for (int j = 0; j < n; j++) {
        for (size_t p = 0; p < K; p++) b[(size_t)j * kp + p] = tb ? B[j + p * ldb] : B[p + (size_t)j * ldb];
    }
    int i = 0;
    for (; i + 2 <= m; i += 2) {
        const float* a0 = &a[(size_t)i * kp];
        const float* a1 = a0 + kp;
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            const float* b0 = &b[(size_t)j * kp];
            v8 s00 = {}, s01 = {}, s02 = {}, s03 = {}, s10 = {}, s11 = {}, s12 = {}, s13 = {};
            for (size_t p = 0; p < kp; p += 8) {
                v8 x0 = load8(a0 + p), x1 = load8(a1 + p);
                v8 y0 = load8(b0 + p), y1 = load8(b0 + kp + p), y2 = load8(b0 + 2 * kp + p),
                   y3 = load8(b0 + 3 * kp + p);
                s00 += x0 * y0; s01 += x0 * y1; s02 += x0 * y2; s03 += x0 * y3;
                s10 += x1 * y0; s11 += x1 * y1; s12 += x1 * y2; s13 += x1 * y3;
            }
            float* d = &dot[(size_t)i * n + j];
            d[0] = hsum(s00); d[1] = hsum(s01); d[2] = hsum(s02); d[3] = hsum(s03);
            d[n] = hsum(s10); d[n + 1] = hsum(s11); d[n + 2] = hsum(s12); d[n + 3] = hsum(s13);
        }
        for (; j < n; j++) {
            const float* b0 = &b[(size_t)j * kp];
            v8 s0 = {}, s1 = {};
            for (size_t p = 0; p < kp; p += 8) {
                v8 y = load8(b0 + p);
                s0 += load8(a0 + p) * y;
                s1 += load8(a1 + p) * y;
            }
            dot[(size_t)i * n + j] = hsum(s0);
            dot[(size_t)(i + 1) * n + j] = hsum(s1);
        }
    }
    for (; i < m; i++) {
        const float* a0 = &a[(size_t)i * kp];
        for (int j = 0; j < n; j++) {
            const float* b0 = &b[(size_t)j * kp];
            v8 s0 = {};
            for (size_t p = 0; p < kp; p += 8) s0 += load8(a0 + p) * load8(b0 + p);
            dot[(size_t)i * n + j] = hsum(s0);
        }
    }
    for (int j = 0; j < n; j++) {
        float* c = C + (size_t)j * ldc;
        if (beta == 0.0f) {
            for (int r = 0; r < m; r++) c[r] = alpha * dot[(size_t)r * n + j];
        } else {
            for (int r = 0; r < m; r++) c[r] = alpha * dot[(size_t)r * n + j] + beta * c[r];
        }
    }
}

/// The bytes a column-major matrix of `rows` × `cols` with leading dimension `ld` spans.
uint64_t extent(int rows, int cols, int ld) {
    if (rows == 0 || cols == 0) return 0;
    return ((uint64_t)(cols - 1) * (uint64_t)ld + (uint64_t)rows) * sizeof(float);
}

bool overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) { return an && bn && a < b + bn && b < a + an; }

} // namespace

SG_API cublasStatus_t cublasCreate_v2(cublasHandle_t* out) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (out == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate_v2: null pointer");
    Context* c = current();
    if (c == nullptr || !c->active) {
        return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate_v2: no context is current on this thread");
    }
    if (c->sticky != CUDA_SUCCESS) {
        return refuse(CUBLAS_STATUS_NOT_INITIALIZED,
                      "cublasCreate_v2: cuda:" + std::to_string(c->device) + " is lost (a sticky error)");
    }
    Handle* h = new Handle(); // never freed: a stale handle stays recognisable
    h->ctx = c;
    h->generation = c->generation;
    g_handles.insert(h);
    *out = reinterpret_cast<cublasHandle_t>(h);
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasDestroy_v2(cublasHandle_t hh) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasDestroy_v2", &st);
    if (h == nullptr) return st;
    g_handles.erase(h);
    // cublasDestroy waits for the device; on a lost context that fails.
    if (h->ctx->sticky == CUDA_SUCCESS) run_context(h->ctx);
    if (h->ctx->sticky != CUDA_SUCCESS) {
        return refuse(CUBLAS_STATUS_INTERNAL_ERROR, "cublasDestroy_v2: cuda:" + std::to_string(h->ctx->device) +
                                                        " is lost (a sticky error): the handle's resources "
                                                        "cannot be released");
    }
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasSetStream_v2(cublasHandle_t hh, CUstream stream) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasSetStream_v2", &st);
    if (h == nullptr) return st;
    std::string why;
    if (stream_of(h->ctx, stream, &why) == nullptr) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream_v2: " + why);
    }
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasSetMathMode(cublasHandle_t hh, int mode) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasSetMathMode", &st);
    if (h == nullptr) return st;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_PEDANTIC_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH &&
        mode != CUBLAS_TENSOR_OP_MATH) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode: unknown mode " + std::to_string(mode));
    }
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasGetMathMode(cublasHandle_t hh, int* mode) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasGetMathMode", &st);
    if (h == nullptr) return st;
    if (mode == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode: null pointer");
    *mode = h->math;
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t hh, int mode) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasSetPointerMode_v2", &st);
    if (h == nullptr) return st;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSetPointerMode_v2: unknown mode");
    }
    h->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t hh, int* mode) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasGetPointerMode_v2", &st);
    if (h == nullptr) return st;
    if (mode == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGetPointerMode_v2: null pointer");
    *mode = h->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/// The soft GPU's cuBLAS is version 0.1.0: no real cuBLAS has major version 0, so the numerics
/// class of its results (`…-cublas0.1.0-…`) never equals a real GPU's.
SG_API cublasStatus_t cublasGetProperty(int type, int* value) {
    if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION: *value = 0; break;
    case MINOR_VERSION: *value = 1; break;
    case PATCH_LEVEL: *value = 0; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

SG_API cublasStatus_t cublasSgemm_v2(cublasHandle_t hh, int transa, int transb, int m, int n, int k,
                                     const float* alpha, const float* A, int lda, const float* B, int ldb,
                                     const float* beta, float* C, int ldc) {
    std::lock_guard<std::mutex> lock(g_mu);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    Handle* h = handle_of(hh, "cublasSgemm_v2", &st);
    if (h == nullptr) return st;
    Context* c = h->ctx;
    if (current() != c) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "cublasSgemm_v2: the handle was created on cuda:" + std::to_string(c->device) + " but " +
                          (current() ? "cuda:" + std::to_string(current()->device) : std::string("no context")) +
                          " is current on this thread (bind the handle's context first)");
    }
    if (c->sticky != CUDA_SUCCESS) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasSgemm_v2: device pointer mode is not modelled");
    }
    auto op_name = [](int t) { return t == CUBLAS_OP_N ? "N" : t == CUBLAS_OP_T ? "T" : "C"; };
    std::ostringstream call;
    call << "cublasSgemm_v2(transa=" << op_name(transa) << ", transb=" << op_name(transb) << ", m=" << m
         << ", n=" << n << ", k=" << k << ", lda=" << lda << ", ldb=" << ldb << ", ldc=" << ldc << ")";
    auto illegal = [&](int param, const std::string& why) {
        std::ostringstream s;
        s << call.str() << ": parameter " << param << " is illegal: " << why;
        return refuse(CUBLAS_STATUS_INVALID_VALUE, s.str());
    };
    auto op_ok = [](int t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C; };
    if (!op_ok(transa)) return illegal(2, "transa is not N, T or C");
    if (!op_ok(transb)) return illegal(3, "transb is not N, T or C");
    if (m < 0) return illegal(4, "m < 0");
    if (n < 0) return illegal(5, "n < 0");
    if (k < 0) return illegal(6, "k < 0");
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    int a_rows = ta ? k : m, a_cols = ta ? m : k;
    int b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (lda < std::max(1, a_rows)) {
        return illegal(9, std::string("lda must be at least max(1, ") + (ta ? "k" : "m") + " = " +
                              std::to_string(a_rows) + ") with transa = " + op_name(transa));
    }
    if (ldb < std::max(1, b_rows)) {
        return illegal(11, std::string("ldb must be at least max(1, ") + (tb ? "n" : "k") + " = " +
                               std::to_string(b_rows) + ") with transb = " + op_name(transb));
    }
    if (ldc < std::max(1, m)) return illegal(14, "ldc must be at least max(1, m = " + std::to_string(m) + ")");
    if (alpha == nullptr || beta == nullptr) return illegal(alpha == nullptr ? 7 : 12, "null scalar");
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    float al = *alpha, be = *beta;
    uint64_t pa = reinterpret_cast<uint64_t>(A), pb = reinterpret_cast<uint64_t>(B), pc = reinterpret_cast<uint64_t>(C);
    uint64_t na = k > 0 ? extent(a_rows, a_cols, lda) : 0, nb = k > 0 ? extent(b_rows, b_cols, ldb) : 0;
    uint64_t nc = extent(m, n, ldc);
    if (overlaps(pc, nc, pa, na)) return illegal(13, "C overlaps A (BLAS forbids it)");
    if (overlaps(pc, nc, pb, nb)) return illegal(13, "C overlaps B (BLAS forbids it)");
    std::string why;
    Stream* s = stream_of(c, h->stream, &why);
    if (s == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSgemm_v2: the handle's stream: " + why);
    Op op;
    op.what = call.str();
    auto touch = [&](uint64_t p, uint64_t bytes, bool write) {
        if (bytes == 0) return;
        Alloc* a = find_alloc(p);
        if (a == nullptr) return;
        for (Touch& t : op.touches) {
            if (t.alloc == a) {
                t.write = t.write || write;
                return;
            }
        }
        op.touches.push_back({a, write});
    };
    touch(pa, na, false);
    touch(pb, nb, false);
    touch(pc, nc, true);
    op.run = [=](Op& o) {
        std::string w;
        if ((na && !range_live(pa, na, o.what + " reading A", &w)) ||
            (nb && !range_live(pb, nb, o.what + " reading B", &w)) ||
            !range_live(pc, nc, o.what + " writing C", &w)) {
            return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS, w);
        }
        auto host = [](uint64_t p) {
            Alloc* a = find_alloc(p);
            return a->host + (p - a->base);
        };
        const float* a = na ? reinterpret_cast<const float*>(host(pa)) : nullptr;
        const float* b = nb ? reinterpret_cast<const float*>(host(pb)) : nullptr;
        float* cc = reinterpret_cast<float*>(host(pc));
        sgemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, cc, ldc);
        return CUDA_SUCCESS;
    };
    CUresult r = enqueue(s, std::move(op));
    return r == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
