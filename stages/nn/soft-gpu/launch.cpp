// Running one kernel launch on the host: blocks one after another; within a block, a kernel
// without barriers runs its threads one after another, and a kernel with __syncthreads runs
// each thread on a fiber (Boost.Context) that yields at the barrier, so every thread of the
// block reaches the barrier before any goes past it, as on a GPU. Between barriers the threads
// run in a shuffled order (fixed per phase of the launch), so code that relies on the order of
// threads gives other results here than in the obvious order.
//
// Checks, reported like compute-sanitizer reports them and failing the launch with a sticky
// error: every access through a pointer parameter against its allocation (memcheck), two
// threads of one launch touching a word one of them wrote with no barrier between them
// (racecheck, global memory), and threads of a block waiting at different barriers or
// returning while others wait (synccheck).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/detail/fcontext.hpp>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <sstream>

#include "kernel_rt.hpp"
#include "kernel_table.hpp"
#include "softgpu.hpp"

namespace sg {

extern const KernelDef g_kernels[];
extern const size_t g_kernel_count;

KRun* g_run = nullptr;
static LaunchArgs* g_launch = nullptr;

const KernelDef* find_kernel(const std::string& name) {
    for (size_t i = 0; i < g_kernel_count; i++) {
        if (name == g_kernels[i].name) return &g_kernels[i];
    }
    return nullptr;
}
size_t kernel_count() { return g_kernel_count; }
const KernelDef* kernel_at(size_t i) { return i < g_kernel_count ? &g_kernels[i] : nullptr; }

static const size_t MAX_PROBLEMS = 8;

static std::string where() {
    KRun* r = g_run;
    char b[200];
    snprintf(b, sizeof b, "thread (%u,%u,%u) of block (%u,%u,%u) in %s", r->cur->idx.x, r->cur->idx.y,
             r->cur->idx.z, r->block_idx.x, r->block_idx.y, r->block_idx.z, r->kernel);
    return b;
}

static void problem(CUresult code, const std::string& what) {
    LaunchArgs& L = *g_launch;
    L.problem_count++;
    if (L.problem_code == CUDA_SUCCESS) L.problem_code = code;
    if (L.problems.size() < MAX_PROBLEMS) L.problems.push_back(what);
}

static std::string param_name(int param) {
    const KernelDef* d = g_launch->def;
    if (param < 0) return "a __shared__ array";
    std::ostringstream s;
    s << "parameter " << param;
    if ((size_t)param < d->names.size()) s << " (" << d->names[param] << ")";
    return s.str();
}

void* bad_access(const Alloc* a, uint64_t addr, const void* base, int64_t index, int64_t len,
                 size_t size, int param, int kind) {
    alignas(16) static thread_local unsigned char scratch[16];
    memset(scratch, 0, sizeof scratch);
    (void)base;
    const char* how = kind == READ ? "read" : kind == WRITE ? "write" : "read-modify-write";
    std::ostringstream s;
    s << "memcheck: invalid " << (param < 0 ? "__shared__ " : "__global__ ") << how << " of size " << size
      << " by " << where() << ": element " << index << " of " << param_name(param);
    if (param < 0) {
        s << ", which has " << len << " elements";
    } else if (a == nullptr) {
        s << ", whose address " << (addr == 0 ? std::string("is null") : describe_address(addr, size));
    } else if (a->state == AllocState::Freed) {
        s << ", allocation #" << a->id << " (" << a->bytes << " bytes at 0x" << std::hex << a->base << std::dec
          << "), freed by " << a->freed_by;
    } else if (a->state == AllocState::Pending) {
        s << ", allocation #" << a->id << ", which its stream has not allocated yet (" << a->made_by
          << " has not run: the allocation is used on another stream before its stream reached it)";
    } else {
        int64_t byte = index * (int64_t)size;
        s << ", a " << len << "-element allocation #" << a->id << " (" << a->bytes << " bytes at 0x" << std::hex
          << a->base << std::dec << "): ";
        if (byte < 0) {
            s << (-byte) << " bytes before its start";
        } else {
            s << (byte - (int64_t)a->bytes) << " bytes after its end";
        }
    }
    problem(CUDA_ERROR_ILLEGAL_ADDRESS, s.str());
    return scratch;
}

static const uint64_t THREAD_BITS = 24;

void race_found(Alloc* a, int64_t offset, uint64_t seen, int kind) {
    KRun* r = g_run;
    uint64_t mask = (1ull << THREAD_BITS) - 1;
    uint64_t other = (seen >> 8) & mask, me = (r->cur->tag >> 8) & mask;
    uint32_t other_phase = (uint32_t)(seen & 0xff);
    bool same_block = other / r->threads == me / r->threads;
    if (same_block && other_phase != (r->phase & 0xff)) return; // a barrier lies between
    std::ostringstream m;
    m << "racecheck: " << (kind == READ ? "read" : kind == WRITE ? "write" : "read-modify-write") << " by "
      << where() << " of byte " << offset << " of allocation #" << a->id << ", which thread "
      << other % r->threads << " of block " << other / r->threads << " wrote in the same launch "
      << (same_block ? "with no __syncthreads between them" : "(a GPU runs blocks in no fixed order)");
    problem(CUDA_ERROR_LAUNCH_FAILED, m.str());
}

Resolved resolve_pointer(LaunchArgs& L, size_t param, uint64_t addr, size_t elem) {
    Resolved r;
    if (addr == 0) return r; // a null pointer: fine unless dereferenced
    Alloc* a = find_alloc(addr);
    if (a == nullptr) return r;
    r.alloc = a;
    r.base = a->base;
    if (a->ctx != L.ctx) {
        std::ostringstream s;
        s << "memcheck: " << L.def->name << " " << "parameter " << param << " points into allocation #" << a->id
          << " of cuda:" << a->ctx->device << " but the kernel runs on cuda:" << L.ctx->device;
        L.problems.push_back(s.str());
        L.problem_count++;
        L.problem_code = CUDA_ERROR_ILLEGAL_ADDRESS;
        r.ok = false;
        return r;
    }
    uint64_t byte = addr - a->base;
    if (byte % elem != 0) {
        std::ostringstream s;
        s << "memcheck: " << L.def->name << " parameter " << param << " (" << describe_address(addr, elem)
          << ") is not aligned to its element size " << elem;
        L.problems.push_back(s.str());
        L.problem_count++;
        L.problem_code = CUDA_ERROR_MISALIGNED_ADDRESS;
        r.ok = false;
        return r;
    }
    r.off = (int64_t)(byte / elem);
    if (a->state == AllocState::Live) {
        r.data = a->host;
        r.len = (int64_t)(a->bytes / elem);
        // Racecheck the allocations this launch writes (one that no thread writes cannot race).
        if (config().racecheck && std::find(L.written.begin(), L.written.end(), a) != L.written.end()) {
            if (a->shadow.empty()) a->shadow.assign((a->bytes + 3) / 4, 0);
            r.shadow = a->shadow.data();
        }
    }
    return r;
}

// --- fibers ------------------------------------------------------------------------------
// Boost.Context's fcontext: a switch saves and restores the callee-saved registers and the
// stack pointer, nothing else (a few nanoseconds; a barrier kernel switches twice per thread
// per barrier).

namespace bc = boost::context::detail;

/// Stacks for the fibers of one block, reused from launch to launch: 16 KiB each with a guard
/// page below (a kernel that overflows its stack faults instead of writing over another's).
class StackPool {
  public:
    static constexpr size_t SIZE = 16 * 1024;
    void* top(size_t i) {
        grow(i + 1);
        return stacks_[i] + SIZE;
    }

  private:
    void grow(size_t n) {
        while (stacks_.size() < n) {
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            char* m = static_cast<char*>(
                mmap(nullptr, SIZE + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
            if (m == MAP_FAILED) {
                report("cannot map a fiber stack; out of memory");
                abort();
            }
            mprotect(m, page, PROT_NONE);
            stacks_.push_back(m + page);
        }
    }
    std::vector<char*> stacks_;
};
static StackPool g_stacks;

/// A thread's fiber: its context while it is suspended, and the scheduler's while it runs.
struct FiberState {
    bc::fcontext_t self = nullptr;
    bc::fcontext_t back = nullptr;
};

/// What a new fiber needs to start: its thread and the launch's body.
struct FiberStart {
    KThread* thread;
    FiberState* state;
    void (*body)(void*);
    void* arg;
};

/// Suspend the running fiber and go back to the scheduler.
static inline void yield_to_scheduler(FiberState* f) {
    bc::transfer_t t = bc::jump_fcontext(f->back, nullptr);
    f->back = t.fctx;
}

/// A fiber's life: for each block of the launch, run the thread's body, say so, wait. It never
/// returns: at the end of the launch it is abandoned (its frames hold nothing to destroy) and
/// its stack serves the next launch.
static void fiber_main(bc::transfer_t t) {
    FiberStart start = *static_cast<FiberStart*>(t.data);
    start.state->back = t.fctx;
    for (;;) {
        g_run->cur = start.thread;
        start.body(start.arg);
        start.thread->done = true;
        yield_to_scheduler(start.state);
    }
}

void sync_threads(int line) {
    KRun* r = g_run;
    KThread* t = r->cur;
    if (!r->fibers) {
        // gen_kernels.py found no __syncthreads on this kernel's path: a barrier here cannot
        // be honoured (the threads before this one have finished).
        problem(CUDA_ERROR_LAUNCH_FAILED,
                std::string("synccheck: ") + r->kernel + " reached a __syncthreads (cuda_kernels.cu:" +
                    std::to_string(line) +
                    ") that gen_kernels.py did not see; rebuild the soft GPU (bash .ci/soft-gpu.sh DIR) or "
                    "report the kernel");
        return;
    }
    t->at_barrier = true;
    t->barrier_line = line;
    yield_to_scheduler(static_cast<FiberState*>(t->fiber));
    r->cur = t;
}

/// A fixed shuffle of 0..n-1.
static void shuffle(std::vector<uint32_t>& order, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (size_t i = order.size(); i > 1; i--) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        size_t j = (size_t)((x * 0x2545F4914F6CDD1Dull) % i);
        std::swap(order[i - 1], order[j]);
    }
}

/// The fibers of one launch of a barrier kernel: one per thread of a block, kept for every
/// block.
class Fibers {
  public:
    Fibers(std::vector<KThread>& threads, void (*body)(void*), void* arg) : threads_(threads), fs_(threads.size()) {
        for (size_t t = 0; t < threads.size(); t++) {
            threads[t].fiber = &fs_[t];
            FiberStart start{&threads[t], &fs_[t], body, arg};
            bc::fcontext_t c = bc::make_fcontext(g_stacks.top(t), StackPool::SIZE, fiber_main);
            // Start it: it reads `start`, runs the thread's body for block 0 and comes back
            // at its first barrier or at its end.
            starts_.push_back(start);
            fs_[t].self = c;
        }
    }

    /// Run one block: every thread from the start of the body to its end, barrier by barrier.
    void run_block(KRun& r) {
        for (uint32_t phase = 0;; phase++) {
            size_t waiting = 0, done = 0;
            int line = 0;
            bool mixed = false;
            for (uint32_t t : order(phase)) {
                KThread& th = threads_[t];
                if (!th.done) {
                    th.at_barrier = false;
                    r.cur = &th;
                    void* data = first_ ? &starts_[t] : nullptr;
                    bc::transfer_t back = bc::jump_fcontext(fs_[t].self, data);
                    fs_[t].self = back.fctx;
                }
                if (th.done) {
                    done++;
                } else {
                    waiting++;
                    if (line == 0) line = th.barrier_line;
                    mixed = mixed || th.barrier_line != line;
                }
            }
            first_ = false;
            if (waiting == 0) return;
            if (done > 0 || mixed) {
                std::ostringstream s;
                s << "synccheck: divergent __syncthreads in block (" << r.block_idx.x << "," << r.block_idx.y << ","
                  << r.block_idx.z << ") of " << r.kernel << ": ";
                if (done > 0) {
                    s << done << " thread(s) returned while " << waiting << " wait at cuda_kernels.cu:" << line;
                } else {
                    s << "threads wait at different barriers (cuda_kernels.cu:" << line << " and others)";
                }
                for (auto& th : threads_) {
                    if (!th.done) {
                        r.cur = &th;
                        break;
                    }
                }
                problem(CUDA_ERROR_LAUNCH_FAILED, s.str());
                return; // the launch stops; its fibers are abandoned
            }
            r.phase++;
        }
    }

  private:
    /// The order threads run in between barriers `phase` and `phase + 1` (the same for every
    /// block of the launch).
    const std::vector<uint32_t>& order(uint32_t phase) {
        while (orders_.size() <= phase) {
            std::vector<uint32_t> o(threads_.size());
            for (size_t t = 0; t < o.size(); t++) o[t] = (uint32_t)t;
            shuffle(o, orders_.size() + 1);
            orders_.push_back(std::move(o));
        }
        return orders_[phase];
    }

    std::vector<KThread>& threads_;
    std::vector<FiberState> fs_;
    std::vector<FiberStart> starts_;
    std::vector<std::vector<uint32_t>> orders_;
    bool first_ = true;
};

CUresult execute(LaunchArgs& L, void (*body)(void*), void* arg) {
    KRun r{};
    r.kernel = L.def->name;
    r.grid = {L.grid.x, L.grid.y, L.grid.z};
    r.block = {L.block.x, L.block.y, L.block.z};
    r.threads = L.block.x * L.block.y * L.block.z;
    r.launch_no = L.launch_no;
    r.fibers = L.def->barriers;
    g_run = &r;
    g_launch = &L;
    std::vector<KThread> threads(r.threads);
    std::unique_ptr<Fibers> fibers;
    if (r.fibers) fibers = std::make_unique<Fibers>(threads, body, arg);
    uint64_t blocks = (uint64_t)L.grid.x * L.grid.y * L.grid.z;
    for (uint64_t b = 0; b < blocks && L.problem_count == 0; b++) {
        r.block_linear = b;
        r.phase = 0;
        r.block_idx = {(unsigned)(b % L.grid.x), (unsigned)((b / L.grid.x) % L.grid.y),
                       (unsigned)(b / ((uint64_t)L.grid.x * L.grid.y))};
        for (uint32_t t = 0; t < r.threads; t++) {
            KThread& th = threads[t];
            void* fiber = th.fiber;
            th = KThread{};
            th.fiber = fiber;
            th.linear = t;
            th.idx = {t % L.block.x, (t / L.block.x) % L.block.y, t / (L.block.x * L.block.y)};
            uint64_t id = (b * r.threads + t) & ((1ull << THREAD_BITS) - 1);
            th.tag = (uint64_t)r.launch_no << 32 | id << 8; // | the block's phase, when used
        }
        if (fibers) {
            fibers->run_block(r);
        } else {
            for (uint32_t t = 0; t < r.threads; t++) {
                r.cur = &threads[t];
                body(arg);
            }
        }
    }
    fibers.reset();
    g_run = nullptr;
    g_launch = nullptr;
    return L.problem_code;
}

} // namespace sg
