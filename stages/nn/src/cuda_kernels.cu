// upcc's CUDA kernels (f32 tensors, f64 loss slots), compiled once per process by NVRTC.
//
// NVRTC compiles this file behind a header that cuda.rs generates from its kernel table:
// `#define RED` (threads of the block reductions) and an `extern "C"` prototype per kernel, so
// a definition here whose parameters differ from the table does not compile. NVRTC has no
// math.h: the constants below are spelled out.
//
// Determinism: no atomics anywhere. Reductions run in one block with a fixed number of threads
// (each thread sums a fixed strided subset in order, then a fixed shared-memory tree), and
// scatters either touch distinct rows (the caller says so) or walk the rows serially per column.
// So two runs on the same GPU give the same bits.

typedef long long i64;

// +infinity as a double (no INFINITY macro under NVRTC).
#define UPCC_INF __longlong_as_double(0x7ff0000000000000LL)

// In-place tree reduction of RED doubles in shared memory; thread 0 ends with the total.
__device__ double block_sum(double v, double* sh) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = RED / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ double softplus_d(double x) {
    return x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
}
__device__ float softplus_f(float x) {
    return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
__device__ double sigmoid_d(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

extern "C" __global__ void k_fill(float* x, float v, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

extern "C" __global__ void k_axpy_range(float a, const float* src, i64 so, float* dst, i64 d0, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[d0 + i] += a * src[so + i];
}

extern "C" __global__ void k_set_column(const float* src, float* dst, i64 rows, i64 cols, i64 col) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) dst[r * cols + col] = src[r];
}

// act: 0 identity, 1 relu, 2 tanh
extern "C" __global__ void k_bias_act(float* y, const float* bias, int has_bias, i64 rows, i64 cols, int act) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    float v = y[i];
    if (has_bias) v += bias[i % cols];
    if (act == 1) v = v < 0.0f ? 0.0f : v;
    else if (act == 2) v = tanhf(v);
    y[i] = v;
}

extern "C" __global__ void k_act_backward(const float* y, const float* dy, float* dz, i64 n, int act) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = dy[i];
    if (act == 1) g = y[i] > 0.0f ? g : 0.0f;
    else if (act == 2) g = g * (1.0f - y[i] * y[i]);
    dz[i] = g;
}

// Column sums: block (32, 8); thread (x, y) sums rows y, y+8, ... of column blockIdx.x*32+x in
// order; the 8 partial sums are then added in order.
extern "C" __global__ void k_col_sums_acc(const float* dz, i64 rows, i64 cols, float* db) {
    __shared__ float sh[8][33];
    i64 c = (i64)blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < cols) {
        for (i64 r = threadIdx.y; r < rows; r += 8) acc += dz[r * cols + c];
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float s = 0.0f;
        for (int k = 0; k < 8; k++) s += sh[k][threadIdx.x];
        db[c] += s;
    }
}

extern "C" __global__ void k_mul(const float* x, const float* m, float* y, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * m[i];
}

extern "C" __global__ void k_mul_acc(const float* dy, const float* m, float* dx, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] += dy[i] * m[i];
}

// One block (RED threads) per row.
extern "C" __global__ void k_l2norm(const float* x, i64 rows, i64 cols, float eps, float* y, float* norms) {
    __shared__ double sh[RED];
    i64 r = blockIdx.x;
    const float* row = x + r * cols;
    double ss = 0.0;
    for (i64 c = threadIdx.x; c < cols; c += RED) ss += (double)row[c] * (double)row[c];
    ss = block_sum(ss, sh);
    float n = fmaxf((float)sqrt(ss), eps);
    if (threadIdx.x == 0) norms[r] = n;
    for (i64 c = threadIdx.x; c < cols; c += RED) y[r * cols + c] = row[c] / n;
}

extern "C" __global__ void k_l2norm_backward(const float* y, const float* norms, float eps, const float* dy,
                                             i64 rows, i64 cols, float* dx) {
    __shared__ double sh[RED];
    i64 r = blockIdx.x;
    float n = norms[r];
    int clamped = n <= eps;
    double dot = 0.0;
    if (!clamped) {
        for (i64 c = threadIdx.x; c < cols; c += RED) dot += (double)y[r * cols + c] * (double)dy[r * cols + c];
    }
    dot = block_sum(dot, sh);
    float d = (float)dot;
    for (i64 c = threadIdx.x; c < cols; c += RED) {
        i64 k = r * cols + c;
        dx[k] += (dy[k] - y[k] * d) / n;
    }
}

extern "C" __global__ void k_pair_dot(const float* u, i64 cols, const unsigned* a, i64 ao, const unsigned* b, i64 bo,
                                      i64 n, float* out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float* ra = u + (i64)a[ao + i] * cols;
    const float* rb = u + (i64)b[bo + i] * cols;
    float s = 0.0f;
    for (i64 c = 0; c < cols; c++) s += ra[c] * rb[c];
    out[i] = s;
}

// du[dst_i] += g_i * u[src_i] for distinct dst_i: one thread per element.
extern "C" __global__ void k_pair_dot_backward_pass(const float* u, i64 cols, const unsigned* dst, i64 d0,
                                                    const unsigned* src, i64 s0, const float* g, i64 n, float* du) {
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * cols) return;
    i64 i = k / cols, c = k % cols;
    du[(i64)dst[d0 + i] * cols + c] += g[i] * u[(i64)src[s0 + i] * cols + c];
}

// Any indices: one thread per column walks the pairs in order.
extern "C" __global__ void k_pair_dot_backward_serial(const float* u, i64 cols, const unsigned* a, i64 ao,
                                                      const unsigned* b, i64 bo, const float* g, i64 n, float* du) {
    i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (i64 i = 0; i < n; i++) {
        i64 ra = (i64)a[ao + i] * cols + c, rb = (i64)b[bo + i] * cols + c;
        float ua = u[ra], ub = u[rb];
        du[ra] += g[i] * ub;
        du[rb] += g[i] * ua;
    }
}

extern "C" __global__ void k_gather_rows(const float* x, i64 cols, const unsigned* idx, i64 off, i64 n, float* out) {
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * cols) return;
    i64 i = k / cols, c = k % cols;
    out[k] = x[(i64)idx[off + i] * cols + c];
}

extern "C" __global__ void k_scatter_add_distinct(const float* dout, i64 cols, const unsigned* idx, i64 off, i64 n, float* dx) {
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * cols) return;
    i64 i = k / cols, c = k % cols;
    dx[(i64)idx[off + i] * cols + c] += dout[k];
}

extern "C" __global__ void k_scatter_add_serial(const float* dout, i64 cols, const unsigned* idx, i64 off, i64 n, float* dx) {
    i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (i64 i = 0; i < n; i++) dx[(i64)idx[off + i] * cols + c] += dout[i * cols + c];
}

// Fused ProbPair BCE, one block of RED threads.
extern "C" __global__ void k_probpair_bce(const float* c, const float* m_raw, const float* t_raw, const float* y,
                                          const float* w, i64 n, double denom, float* dc, double* out, i64 slot) {
    __shared__ double sh[RED];
    float mr = m_raw[0], tr = t_raw[0];
    float m = tanhf(mr), t = softplus_f(tr);
    double m64 = (double)m, t64 = (double)t;
    double loss = 0.0, dm = 0.0, dt = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) {
        double l = ((double)c[i] - m64) / t64;
        double yi = (double)y[i], wi = (double)w[i];
        loss += wi * (softplus_d(l) - yi * l);
        double g = wi * (sigmoid_d(l) - yi) / denom;
        dc[i] = (float)(g / t64);
        dm -= g / t64;
        dt -= g * l / t64;
    }
    loss = block_sum(loss, sh);
    dm = block_sum(dm, sh);
    dt = block_sum(dt, sh);
    if (threadIdx.x == 0) {
        out[slot] = loss / denom;
        out[slot + 1] = dm * (1.0 - m64 * m64);
        out[slot + 2] = dt * sigmoid_d((double)tr);
    }
}

extern "C" __global__ void k_pair_readout(const float* u, i64 cols, const unsigned* a, i64 ao, const unsigned* b, i64 bo,
                                          const float* m_raw, const float* t_raw, i64 n, float* out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double m = tanh((double)m_raw[0]);
    double t = softplus_d((double)t_raw[0]);
    const float* ra = u + (i64)a[ao + i] * cols;
    const float* rb = u + (i64)b[bo + i] * cols;
    double c = 0.0;
    for (i64 k = 0; k < cols; k++) c += (double)ra[k] * (double)rb[k];
    out[i] = (float)sigmoid_d((c - m) / t);
}

extern "C" __global__ void k_sq_error_grad(const float* x, const float* t, float s2, i64 n, float* dx) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = s2 * (x[i] - t[i]);
}

extern "C" __global__ void k_sq_error_loss(const float* x, const float* t, i64 n, double scale, double* out, i64 slot) {
    __shared__ double sh[RED];
    double acc = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) {
        double d = (double)x[i] - (double)t[i];
        acc += d * d;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[slot] = acc * scale;
}

extern "C" __global__ void k_softmax_ce(const float* logits, i64 rows, i64 cols, const unsigned* labels, i64 lo,
                                        float* dlogits, double* out, i64 slot) {
    __shared__ double sh[RED];
    double loss = 0.0, correct = 0.0;
    for (i64 r = threadIdx.x; r < rows; r += RED) {
        const float* row = logits + r * cols;
        double best = -UPCC_INF;
        i64 arg = 0;
        for (i64 j = 0; j < cols; j++) {
            if ((double)row[j] > best) { best = (double)row[j]; arg = j; }
        }
        double z = 0.0;
        for (i64 j = 0; j < cols; j++) z += exp((double)row[j] - best);
        double lse = best + log(z);
        i64 label = (i64)labels[lo + r];
        loss += lse - (double)row[label];
        if (arg == label) correct += 1.0;
        for (i64 j = 0; j < cols; j++) {
            double p = exp((double)row[j] - lse);
            double target = j == label ? 1.0 : 0.0;
            dlogits[r * cols + j] = (float)((p - target) / (double)rows);
        }
    }
    loss = block_sum(loss, sh);
    correct = block_sum(correct, sh);
    if (threadIdx.x == 0) {
        out[slot] = loss / (double)(rows > 0 ? rows : 1);
        out[slot + 1] = correct;
    }
}

extern "C" __global__ void k_softmax_rows(const float* logits, i64 rows, i64 cols, float* out) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = logits + r * cols;
    double best = -UPCC_INF;
    for (i64 j = 0; j < cols; j++) best = fmax(best, (double)row[j]);
    double z = 0.0;
    for (i64 j = 0; j < cols; j++) z += exp((double)row[j] - best);
    for (i64 j = 0; j < cols; j++) out[r * cols + j] = (float)(exp((double)row[j] - best) / z);
}

extern "C" __global__ void k_huber_l2(const float* p, const float* t, const float* w, int has_w, i64 n, double delta,
                                      int smooth, double lambda, double denom, float* dp, double* out, i64 slot) {
    __shared__ double sh[RED];
    double loss = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) {
        double pi = (double)p[i];
        double r = pi - (double)t[i];
        double wi = has_w ? (double)w[i] : 1.0;
        double h, dh;
        int inside = fabs(r) <= delta;
        double sg = r > 0.0 ? 1.0 : (r < 0.0 ? -1.0 : 0.0);
        if (!smooth) {
            if (inside) { h = 0.5 * r * r; dh = r; } else { h = delta * (fabs(r) - 0.5 * delta); dh = delta * sg; }
        } else {
            if (inside) { h = 0.5 * r * r / delta; dh = r / delta; } else { h = fabs(r) - 0.5 * delta; dh = sg; }
        }
        loss += wi * (h + lambda * pi * pi);
        dp[i] = (float)(wi * (dh + 2.0 * lambda * pi) / denom);
    }
    loss = block_sum(loss, sh);
    if (threadIdx.x == 0) out[slot] = loss / denom;
}

__device__ double softclip_d(double u, double xi) {
    return (softplus_d(xi * u) - softplus_d(xi * (u - 1.0))) / xi;
}

extern "C" __global__ void k_eci_fuse(const float* y, const float* delta, const float* y_oof, i64 n, double xi,
                                      double gamma, double n0, float* y_bc, float* w) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double yi = (double)y[i];
    double y_cor = softclip_d(yi + (double)delta[i], xi);
    double gap = fabs(softclip_d((double)y_oof[i], xi) - y_cor);
    double wi = pow(fmax(1.0 - gap, 0.0), gamma);
    double nn = n0 * wi;
    y_bc[i] = (float)((yi + nn * y_cor) / (1.0 + nn));
    w[i] = (float)wi;
}

// Σ x² of one buffer into out[slot], one block.
extern "C" __global__ void k_sum_squares(const float* x, i64 n, double* out, i64 slot) {
    __shared__ double sh[RED];
    double acc = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) acc += (double)x[i] * (double)x[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[slot] = acc;
}

// out[count] = max_norm / (sqrt(Σ out[0..count]) + 1e-6), summed in order.
extern "C" __global__ void k_clip_coef(double* parts, i64 count, double max_norm) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double total = 0.0;
    for (i64 i = 0; i < count; i++) total += parts[i];
    parts[count] = max_norm / (sqrt(total) + 1e-6);
}

extern "C" __global__ void k_clip_scale(float* x, i64 n, const double* coef, i64 slot) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    double c = coef[slot];
    if (i < n && c < 1.0) x[i] *= (float)c;
}

extern "C" __global__ void k_scale(float* x, i64 n, float s) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void k_adam(float* p, const float* g, float* m, float* v, i64 n, float b1, float b2, float ob1,
                                  float ob2, float step_size, float bc2_sqrt, float eps) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i];
    float mi = b1 * m[i] + ob1 * gi;
    float vi = b2 * v[i] + ob2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] -= step_size * mi / denom;
}

extern "C" __global__ void k_sgd(float* p, const float* g, float* buf, i64 n, float mu, float lr, int first) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float b = first ? g[i] : mu * buf[i] + g[i];
    buf[i] = b;
    p[i] -= lr * b;
}

extern "C" __global__ void k_scalars_fill(double* s, i64 off, i64 n, double v) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) s[off + i] = v;
}

// dst[ds] = (keep ? dst[ds] : 0) + coef * src[ss]
extern "C" __global__ void k_scalar_axpy(const double* src, i64 ss, double coef, double* dst, i64 ds, int keep) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double base = keep ? dst[ds] : 0.0;
    dst[ds] = base + coef * src[ss];
}

// Same for a source and destination in one vector (a sum over slots of the graph).
extern "C" __global__ void k_scalar_axpy_self(double* s, i64 ss, double coef, i64 ds, int keep) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double base = keep ? s[ds] : 0.0;
    s[ds] = base + coef * s[ss];
}

extern "C" __global__ void k_scalar_to_grad(const double* s, i64 slot, double coef, float* grad) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    grad[0] += (float)(coef * s[slot]);
}

// ---- softmax backward and the deep-clustering baselines ---------------------------------

extern "C" __global__ void k_softmax_backward(const float* s, const float* ds, i64 rows, i64 cols, float* dx) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    double dot = 0.0;
    for (i64 j = 0; j < cols; j++) dot += (double)s[r * cols + j] * (double)ds[r * cols + j];
    for (i64 j = 0; j < cols; j++) {
        i64 k = r * cols + j;
        dx[k] += (float)((double)s[k] * ((double)ds[k] - dot));
    }
}

__device__ double sigmoid_b(const float* b_raw, i64 idx) {
    return sigmoid_d((double)b_raw[idx]);
}

// One block: pairs (i, n + i); P = q_a^T B q_b (B = sigmoid(B') or I); loss, dq (added) and
// d loss/dP per pair into g (for dB').
extern "C" __global__ void k_pair_cobce(const float* q, i64 c, i64 n, const float* b_raw, int has_b, const float* y,
                                       const float* w, double eps, double denom, float* dq, double* g,
                                       double* out, i64 slot) {
    __shared__ double sh[RED];
    double loss = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) {
        const float* qa = q + i * c;
        const float* qb = q + (n + i) * c;
        double p_raw = 0.0;
        for (i64 r = 0; r < c; r++) {
            double bq = 0.0;
            if (has_b) {
                for (i64 k = 0; k < c; k++) bq += sigmoid_b(b_raw, r * c + k) * (double)qb[k];
            } else {
                bq = (double)qb[r];
            }
            p_raw += (double)qa[r] * bq;
        }
        double p = fmin(fmax(p_raw, eps), 1.0 - eps);
        double yi = (double)y[i], wi = (double)w[i];
        loss += -wi * (yi * log(p) + (1.0 - yi) * log(1.0 - p));
        double gi = (p_raw > eps && p_raw < 1.0 - eps) ? wi * (p - yi) / (p * (1.0 - p)) / denom : 0.0;
        g[i] = gi;
        for (i64 k = 0; k < c; k++) {
            double bq = 0.0, bta = 0.0;
            if (has_b) {
                for (i64 j = 0; j < c; j++) {
                    bq += sigmoid_b(b_raw, k * c + j) * (double)qb[j];
                    bta += sigmoid_b(b_raw, j * c + k) * (double)qa[j];
                }
            } else {
                bq = (double)qb[k];
                bta = (double)qa[k];
            }
            dq[i * c + k] += (float)(gi * bq);
            dq[(n + i) * c + k] += (float)(gi * bta);
        }
    }
    loss = block_sum(loss, sh);
    if (threadIdx.x == 0) out[slot] = loss / denom;
}

// dB'[r, k] += sigma'(B'[r, k]) * sum_i g_i q_a[r] q_b[k], pairs in order.
extern "C" __global__ void k_pair_cobce_db(const float* q, i64 c, i64 n, const float* b_raw, const double* g, float* db) {
    i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= c * c) return;
    i64 r = e / c, k = e % c;
    double acc = 0.0;
    for (i64 i = 0; i < n; i++) acc += g[i] * (double)q[i * c + r] * (double)q[(n + i) * c + k];
    double s = sigmoid_b(b_raw, e);
    db[e] += (float)(acc * s * (1.0 - s));
}

// One thread: Cholesky of m + eps I (c x c) into scratch l, log det into out[slot], the
// inverse into minv (zero and -inf if not positive definite). scratch holds 2 c^2 doubles.
extern "C" __global__ void k_spd_logdet_inverse(const float* m, i64 c, double eps, double* out, i64 slot, float* minv,
                                               double* scratch) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double* l = scratch;
    double* li = scratch + c * c;
    for (i64 j = 0; j < c * c; j++) { l[j] = 0.0; li[j] = 0.0; }
    for (i64 i = 0; i < c; i++) {
        for (i64 j = 0; j <= i; j++) {
            double sum = (double)m[i * c + j] + (i == j ? eps : 0.0);
            for (i64 k = 0; k < j; k++) sum -= l[i * c + k] * l[j * c + k];
            if (i == j) {
                if (!(sum > 0.0) || isinf(sum) || isnan(sum)) {
                    out[slot] = -UPCC_INF;
                    for (i64 t = 0; t < c * c; t++) minv[t] = 0.0f;
                    return;
                }
                l[i * c + i] = sqrt(sum);
            } else {
                l[i * c + j] = sum / l[j * c + j];
            }
        }
    }
    double ld = 0.0;
    for (i64 i = 0; i < c; i++) ld += log(l[i * c + i]);
    out[slot] = 2.0 * ld;
    for (i64 i = 0; i < c; i++) {
        li[i * c + i] = 1.0 / l[i * c + i];
        for (i64 j = 0; j < i; j++) {
            double sum = 0.0;
            for (i64 k = j; k < i; k++) sum += l[i * c + k] * li[k * c + j];
            li[i * c + j] = -sum / l[i * c + i];
        }
    }
    for (i64 i = 0; i < c; i++) {
        for (i64 j = 0; j < c; j++) {
            double sum = 0.0;
            for (i64 k = (i > j ? i : j); k < c; k++) sum += li[k * c + i] * li[k * c + j];
            minv[i * c + j] = (float)sum;
        }
    }
}

extern "C" __global__ void k_student_t(const float* z, const float* mu, i64 rows, i64 d, i64 k, double alpha, double e,
                                      float* q) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    double sum = 0.0;
    for (i64 c = 0; c < k; c++) {
        double d2 = 0.0;
        for (i64 j = 0; j < d; j++) {
            double diff = (double)z[r * d + j] - (double)mu[c * d + j];
            d2 += diff * diff;
        }
        sum += pow(1.0 + d2 / alpha, -e);
    }
    for (i64 c = 0; c < k; c++) {
        double d2 = 0.0;
        for (i64 j = 0; j < d; j++) {
            double diff = (double)z[r * d + j] - (double)mu[c * d + j];
            d2 += diff * diff;
        }
        q[r * k + c] = (float)(pow(1.0 + d2 / alpha, -e) / sum);
    }
}

// Per row: dz (added) and d loss / d u into tmp (rows x k).
extern "C" __global__ void k_student_t_backward_rows(const float* z, const float* mu, const float* q, const float* dq,
                                                    i64 rows, i64 d, i64 k, double alpha, double e, float* dz,
                                                    double* tmp) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    double dot = 0.0;
    for (i64 c = 0; c < k; c++) dot += (double)q[r * k + c] * (double)dq[r * k + c];
    for (i64 c = 0; c < k; c++) {
        double d2 = 0.0;
        for (i64 j = 0; j < d; j++) {
            double diff = (double)z[r * d + j] - (double)mu[c * d + j];
            d2 += diff * diff;
        }
        double u = 1.0 + d2 / alpha;
        tmp[r * k + c] = ((double)dq[r * k + c] - dot) * (double)q[r * k + c] * (-e / u);
    }
    for (i64 j = 0; j < d; j++) {
        double acc = 0.0;
        for (i64 c = 0; c < k; c++)
            acc += tmp[r * k + c] * 2.0 * ((double)z[r * d + j] - (double)mu[c * d + j]) / alpha;
        dz[r * d + j] += (float)acc;
    }
}

// dmu[c, j] -= sum over rows (in order) of tmp[r, c] * 2 (z - mu) / alpha.
extern "C" __global__ void k_student_t_backward_mu(const float* z, const float* mu, const double* tmp, i64 rows, i64 d,
                                                  i64 k, double alpha, float* dmu) {
    i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= k * d) return;
    i64 c = e / d, j = e % d;
    double acc = 0.0;
    for (i64 r = 0; r < rows; r++) acc += tmp[r * k + c] * 2.0 * ((double)z[r * d + j] - (double)mu[c * d + j]) / alpha;
    dmu[e] -= (float)acc;
}

extern "C" __global__ void k_kl_target(const float* q, const float* p, i64 n, double denom, float* dq, double* out, i64 slot) {
    __shared__ double sh[RED];
    double loss = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) {
        double qi = fmax((double)q[i], 1e-30), pi = (double)p[i];
        if (pi > 0.0) loss += pi * log(pi / qi);
        dq[i] = (float)(-pi / (qi * denom));
    }
    loss = block_sum(loss, sh);
    if (threadIdx.x == 0) out[slot] = loss / denom;
}

extern "C" __global__ void k_spherepair_bce(const float* c, const float* y, const float* w, i64 n, double denom, float* dc,
                                           double* out, i64 slot) {
    __shared__ double sh[RED];
    double loss = 0.0;
    for (i64 i = threadIdx.x; i < n; i += RED) {
        double ci = (double)c[i], yi = (double)y[i], wi = (double)w[i];
        double sp = (ci + 1.0) / 2.0, sn = 1.0 - ci * ci;
        double lp = -100.0, dp = 0.0, ln = -100.0, dn = 0.0;
        if (sp > 0.0 && log(sp) > -100.0) { lp = log(sp); dp = 1.0 / (ci + 1.0); }
        if (sn > 0.0 && log(sn) > -100.0) { ln = log(sn); dn = -2.0 * ci / sn; }
        loss += wi * (-(yi * lp + (1.0 - yi) * ln));
        dc[i] = (float)(wi * (-(yi * dp + (1.0 - yi) * dn)) / denom);
    }
    loss = block_sum(loss, sh);
    if (threadIdx.x == 0) out[slot] = loss / denom;
}
