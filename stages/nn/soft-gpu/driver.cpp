// The soft GPU's driver: the part of the CUDA driver API upcc calls through cudarc, on the CPU.
//
// Devices, primary contexts, streams, events, stream-ordered and plain device memory, pinned
// host memory, the default memory pool, CUBIN modules and kernel launches. A stream is a queue:
// nothing it holds runs until the host synchronises with it (cuStreamSynchronize,
// cuCtxSynchronize, cuEventSynchronize, a copy into pageable host memory, which CUDA documents
// as returning only once the copy is done) or another stream waits on one of its events. So a
// result read before synchronising is not there yet, and work on two streams that nothing
// orders runs in whatever order the host happens to synchronise them — and is reported
// (streamcheck) when both touch one allocation and one of them writes it.
//
// Errors: argument errors return their code at the call (with a report); a fault of queued work
// (an access out of bounds, a race, a barrier divergence, an injected fault) poisons the
// context with a sticky error, reported once with the kernel and thread, and every later call
// on that context returns it, as on a real GPU. cuGetErrorString names the detail.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "softgpu.hpp"

namespace sg {

std::mutex g_mu;

static Config g_cfg;
static bool g_init = false;
static std::vector<std::unique_ptr<Context>> g_devices;
static thread_local Context* t_current = nullptr;

static std::map<uint64_t, Alloc*> g_allocs; // by base address; freed ones stay (tombstones)
static std::vector<std::unique_ptr<Alloc>> g_alloc_store;
static uint64_t g_next_addr = 0x5eed00000000ull;
static uint64_t g_alloc_calls = 0;
static uint64_t g_launches = 0;
static uint64_t g_stream_ids = 0;
static std::set<Stream*> g_streams;
static std::set<Event*> g_events;
static std::set<Module*> g_modules;
static std::set<Function*> g_functions;
static VClock g_host; // what the host has seen complete, per stream
static uint64_t g_host_version = 1;
static std::vector<Stream*> g_waiting; // streams blocked in an event wait being served now

const Config& config() { return g_cfg; }

// --- reports and error strings -------------------------------------------------------------

void report(const std::string& message) {
    std::string line = "softgpu: " + message + "\n";
    fwrite(line.data(), 1, line.size(), stderr);
    fflush(stderr);
    if (!g_cfg.log_path.empty()) {
        int fd = open(g_cfg.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t w = write(fd, line.data(), line.size());
            (void)w;
            close(fd);
        }
    }
}

static const char* error_name(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case CUDA_ERROR_INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case CUDA_ERROR_MISALIGNED_ADDRESS: return "CUDA_ERROR_MISALIGNED_ADDRESS";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return "CUDA_ERROR_UNKNOWN";
    }
}

static const char* error_text(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_DEINITIALIZED: return "driver shutting down";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_IMAGE: return "device kernel image is invalid";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return "no kernel image is available for execution on the device";
    case CUDA_ERROR_INVALID_PTX: return "a PTX JIT compilation failed";
    case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
    case CUDA_ERROR_ILLEGAL_STATE: return "the operation is not permitted in the current state";
    case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
    case CUDA_ERROR_NOT_READY: return "device not ready";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "too many resources requested for launch";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return "context is destroyed";
    case CUDA_ERROR_MISALIGNED_ADDRESS: return "misaligned address";
    case CUDA_ERROR_LAUNCH_FAILED: return "unspecified launch failure";
    case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported";
    default: return "unknown error";
    }
}

static std::map<int, std::string> g_detail;
static std::deque<std::string> g_strings; // what cuGetErrorString handed out (kept alive)

void set_error_detail(CUresult code, const std::string& detail) { g_detail[(int)code] = detail; }

/// An argument error: report it, remember it for cuGetErrorString, return its code.
static CUresult fail(CUresult code, const std::string& detail) {
    report(std::string(error_name(code)) + ": " + detail);
    set_error_detail(code, detail);
    return code;
}

std::string stream_name(const Stream* s) {
    std::ostringstream o;
    if (s->is_null) {
        o << "the default stream";
    } else {
        o << "stream " << s->id;
    }
    o << " of cuda:" << s->ctx->device;
    return o.str();
}

// --- configuration -------------------------------------------------------------------------

static void print_profile();

static uint64_t env_u64(const char* name, uint64_t dflt) {
    const char* v = getenv(name);
    if (v == nullptr || *v == 0) return dflt;
    char* end = nullptr;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == nullptr || *end != 0) {
        report(std::string("ignoring ") + name + "=" + v + ": not a number");
        return dflt;
    }
    return x;
}

static void read_config() {
    g_cfg.devices = (int)env_u64("SOFTGPU_DEVICES", 1);
    g_cfg.memory_bytes = env_u64("SOFTGPU_MEMORY_MB", 16384) << 20;
    g_cfg.sms = (int)env_u64("SOFTGPU_SMS", 1);
    if (const char* cc = getenv("SOFTGPU_COMPUTE_CAPABILITY")) {
        int ma = 0, mi = 0;
        if (sscanf(cc, "%d.%d", &ma, &mi) == 2) {
            g_cfg.major = ma;
            g_cfg.minor = mi;
        } else {
            report(std::string("ignoring SOFTGPU_COMPUTE_CAPABILITY=") + cc + ": not MAJOR.MINOR");
        }
    }
    const char* lb = getenv("CUDA_LAUNCH_BLOCKING");
    g_cfg.launch_blocking = lb != nullptr && strcmp(lb, "1") == 0;
    g_cfg.racecheck = env_u64("SOFTGPU_RACECHECK", 1) != 0;
    g_cfg.streamcheck = env_u64("SOFTGPU_STREAMCHECK", 1) != 0;
    g_cfg.fail_alloc = env_u64("SOFTGPU_FAIL_ALLOC", 0);
    g_cfg.fault_launch = env_u64("SOFTGPU_FAULT_LAUNCH", 0);
    g_cfg.fault_device = (int)env_u64("SOFTGPU_FAULT_DEVICE", 0);
    if (const char* l = getenv("SOFTGPU_LOG")) g_cfg.log_path = l;
    g_cfg.profile = env_u64("SOFTGPU_PROFILE", 0) != 0;
    if (g_cfg.profile) atexit(print_profile);
}

// --- contexts and streams ------------------------------------------------------------------

Context* current() { return t_current; }

CUresult context_ok(Context* c) {
    if (c == nullptr) return fail(CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread");
    if (!c->active) return fail(CUDA_ERROR_CONTEXT_IS_DESTROYED, "the current context was released");
    return c->sticky;
}

static void activate(Context* c) {
    c->active = true;
    c->generation++;
    c->sticky = CUDA_SUCCESS;
    c->sticky_detail.clear();
    c->null_stream = std::make_unique<Stream>();
    c->null_stream->id = ++g_stream_ids;
    c->null_stream->ctx = c;
    c->null_stream->generation = c->generation;
    c->null_stream->is_null = true;
    c->streams = {c->null_stream.get()};
}

Stream* stream_of(Context* ctx, CUstream h, std::string* why) {
    if (h == nullptr) {
        if (ctx == nullptr || !ctx->active) {
            *why = "no live context for the default stream";
            return nullptr;
        }
        return ctx->null_stream.get();
    }
    if (reinterpret_cast<uintptr_t>(h) == 2) {
        *why = "the per-thread default stream (CU_STREAM_PER_THREAD) is not modelled by the soft GPU";
        return nullptr;
    }
    Stream* s = reinterpret_cast<Stream*>(h);
    if (g_streams.count(s) == 0 || s->destroyed) {
        *why = "not a live stream (destroyed, or never created)";
        return nullptr;
    }
    if (s->ctx != ctx || s->generation != ctx->generation) {
        *why = stream_name(s) + " does not belong to the current context (cuda:" +
               (ctx ? std::to_string(ctx->device) : std::string("none")) + ")";
        return nullptr;
    }
    return s;
}

/// Drop the queued work of every stream of a lost context.
static void drop_queues(Context* c) {
    for (Stream* s : c->streams) {
        if (!s->queue.empty()) s->done_seq = s->queue.back().seq;
        s->queue.clear();
    }
}

CUresult poison(Context* c, CUresult code, const std::string& detail) {
    if (c->sticky != CUDA_SUCCESS) return c->sticky;
    c->sticky = code;
    c->sticky_detail = detail;
    report("cuda:" + std::to_string(c->device) + ": " + detail + "\nsoftgpu: cuda:" + std::to_string(c->device) +
           " is lost (" + error_name(code) + ", sticky): every later call on its context returns it");
    set_error_detail(code, detail);
    drop_queues(c);
    return code;
}

// --- allocations ---------------------------------------------------------------------------

Alloc* find_alloc(uint64_t addr) {
    auto it = g_allocs.upper_bound(addr);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    Alloc* a = it->second;
    if (addr < a->base + std::max<size_t>(a->bytes, 1)) return a;
    return nullptr;
}

std::string describe_address(uint64_t addr, size_t size) {
    std::ostringstream s;
    s << "0x" << std::hex << addr << std::dec;
    Alloc* a = find_alloc(addr);
    if (a != nullptr) {
        s << " (byte " << (addr - a->base) << " of allocation #" << a->id << ", " << a->bytes << " bytes";
        if (a->state == AllocState::Freed) s << ", freed by " << a->freed_by;
        s << ")";
        return s.str();
    }
    auto it = g_allocs.upper_bound(addr);
    if (it != g_allocs.begin()) {
        Alloc* b = std::prev(it)->second;
        s << " (" << (addr - (b->base + b->bytes)) << " bytes after the end of allocation #" << b->id << ", "
          << b->bytes << " bytes)";
    } else {
        s << " (in no allocation)";
    }
    (void)size;
    return s.str();
}

Alloc* range_alloc(uint64_t addr, size_t bytes, std::string* why) {
    Alloc* a = find_alloc(addr);
    if (a == nullptr) {
        *why = "address " + describe_address(addr, bytes) + " is not device memory";
        return nullptr;
    }
    if (a->state == AllocState::Freed) {
        *why = "address " + describe_address(addr, bytes) + " was freed";
        return nullptr;
    }
    if (addr + bytes > a->base + a->bytes) {
        std::ostringstream s;
        s << bytes << " bytes from " << describe_address(addr, bytes) << " run "
          << (addr + bytes - a->base - a->bytes) << " bytes past the end of allocation #" << a->id;
        *why = s.str();
        return nullptr;
    }
    return a;
}

bool range_live(uint64_t addr, size_t bytes, const std::string& who, std::string* why) {
    Alloc* a = find_alloc(addr);
    std::ostringstream s;
    s << "memcheck: " << who << ": ";
    if (a == nullptr) {
        s << "address " << describe_address(addr, bytes) << " is not device memory";
    } else if (a->state == AllocState::Freed) {
        s << "allocation #" << a->id << " (" << a->bytes << " bytes) was freed by " << a->freed_by
          << " before this ran";
    } else if (a->state == AllocState::Pending) {
        s << "allocation #" << a->id << " is not allocated yet in stream order (" << a->made_by << " has not run)";
    } else if (addr + bytes > a->base + a->bytes) {
        s << bytes << " bytes from byte " << (addr - a->base) << " run " << (addr + bytes - a->base - a->bytes)
          << " bytes past the end of allocation #" << a->id << " (" << a->bytes << " bytes)";
    } else {
        return true;
    }
    *why = s.str();
    return false;
}

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

static Alloc* new_alloc(Context* c, size_t bytes) {
    auto a = std::make_unique<Alloc>();
    a->id = g_alloc_store.size() + 1;
    a->base = g_next_addr;
    a->bytes = bytes;
    a->ctx = c;
    size_t cap = round_up(std::max<size_t>(bytes, 1), 256);
    a->host = static_cast<char*>(aligned_alloc(256, cap));
    if (a->host == nullptr) return nullptr;
    // Device memory is not zeroed: a read of what nothing wrote gives NaN (0xFF bytes).
    memset(a->host, 0xFF, cap);
    // 64 KiB of address space between allocations: an offset that runs off one allocation
    // lands in none instead of in the next.
    g_next_addr = round_up(a->base + bytes, 512) + (64u << 10);
    Alloc* p = a.get();
    g_allocs[p->base] = p;
    g_alloc_store.push_back(std::move(a));
    return p;
}

static void free_storage(Alloc* a, const std::string& by) {
    a->state = AllocState::Freed;
    a->freed_by = by;
    free(a->host);
    a->host = nullptr;
    std::vector<Shadow>().swap(a->shadow);
}

static void trim_pool(Context* c) {
    MemPool& p = c->pool;
    if (p.used + p.cached > p.release_threshold) {
        uint64_t over = p.used + p.cached - p.release_threshold;
        uint64_t release = std::min(p.cached, over);
        p.cached -= release;
        p.released_bytes += release;
    }
}

// --- stream order --------------------------------------------------------------------------

static void merge(VClock& into, const VClock& from) {
    for (auto& [k, v] : from) {
        uint64_t& x = into[k];
        x = std::max(x, v);
    }
}

void host_knows(Stream* s, uint64_t seq) {
    uint64_t& x = g_host[s->id];
    if (seq > x) {
        x = seq;
        g_host_version++;
    }
}

/// Whether `a` (a past access) is ordered before `op` on stream `s`.
static bool ordered_before(const Access& a, const Stream* s, const Op& op) {
    if (a.stream == 0 || a.stream == s->id) return true;
    auto it = op.before->find(a.stream);
    return it != op.before->end() && a.seq <= it->second;
}

static bool waiting_on(uint64_t stream) {
    for (Stream* w : g_waiting) {
        if (w->id == stream) return true;
    }
    return false;
}

static std::string stream_label(uint64_t id) {
    for (Stream* s : g_streams) {
        if (s->id == id) return stream_name(s);
    }
    for (auto& c : g_devices) {
        if (c->null_stream && c->null_stream->id == id) return stream_name(c->null_stream.get());
    }
    return "stream " + std::to_string(id) + " (destroyed)";
}

/// Streamcheck one op about to run: every allocation it touches against the accesses of other
/// streams that nothing orders before it.
static bool stream_order_ok(Stream* s, Op& op, std::string* why) {
    for (Touch& t : op.touches) {
        Alloc* a = t.alloc;
        std::vector<const Access*> conflicts;
        if (!ordered_before(a->last_write, s, op) && !waiting_on(a->last_write.stream)) {
            conflicts.push_back(&a->last_write);
        }
        if (t.write) {
            for (const Access& r : a->reads) {
                if (!ordered_before(r, s, op) && !waiting_on(r.stream)) conflicts.push_back(&r);
            }
        }
        if (!conflicts.empty()) {
            const Access* c = conflicts.front();
            std::ostringstream m;
            m << "streamcheck: " << op.what << " on " << stream_name(s) << (t.write ? " writes" : " reads")
              << " allocation #" << a->id << " (" << a->bytes << " bytes), which " << c->what << " on "
              << stream_label(c->stream) << (c == &a->last_write ? " writes" : " reads")
              << ", and nothing orders the two (no event wait, no synchronisation between them): "
                 "on a GPU they may run in either order or at once";
            *why = m.str();
            return false;
        }
    }
    for (Touch& t : op.touches) {
        Alloc* a = t.alloc;
        Access me{s->id, op.seq, op.what};
        if (t.write) {
            a->last_write = me;
            a->reads.clear();
        } else {
            bool found = false;
            for (Access& r : a->reads) {
                if (r.stream == s->id) {
                    r = me;
                    found = true;
                }
            }
            if (!found) a->reads.push_back(me);
        }
    }
    return true;
}

// SOFTGPU_PROFILE=1: seconds spent per kind of operation, printed when the process exits.
static std::map<std::string, std::pair<double, uint64_t>> g_profile;

static void print_profile() {
    std::vector<std::pair<std::string, std::pair<double, uint64_t>>> v(g_profile.begin(), g_profile.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (auto& e : v) total += e.second.first;
    std::ostringstream o;
    o << "profile: " << total << " s of queued work";
    for (auto& e : v) o << "\n  " << e.second.first << " s  " << e.second.second << "x  " << e.first;
    report(o.str());
}

static CUresult run_op(Stream* s, Op& op) {
    Context* c = s->ctx;
    if (c->sticky != CUDA_SUCCESS) return c->sticky;
    if (g_cfg.streamcheck) {
        std::string why;
        if (!stream_order_ok(s, op, &why)) return poison(c, CUDA_ERROR_LAUNCH_FAILED, why);
    }
    auto t0 = std::chrono::steady_clock::now();
    CUresult r = op.run(op);
    if (g_cfg.profile) {
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        auto& e = g_profile[getenv("SOFTGPU_PROFILE_SHAPES") ? op.what : op.what.substr(0, op.what.find_first_of(" ("))];
        e.first += dt;
        e.second++;
    }
    s->done_seq = std::max(s->done_seq, op.seq);
    if (r != CUDA_SUCCESS && c->sticky == CUDA_SUCCESS) {
        return poison(c, r, op.what + " failed (" + error_name(r) + ")");
    }
    return r;
}

CUresult run_stream(Stream* s, uint64_t upto) {
    if (s->running) {
        // Only a cycle of event waits gets here: a GPU would wait forever.
        if (upto == 0 || (!s->queue.empty() && s->queue.front().seq <= upto)) {
            return poison(s->ctx, CUDA_ERROR_LAUNCH_FAILED,
                          "streamcheck: " + stream_name(s) +
                              " waits (through events) for its own later work: a GPU would hang");
        }
        return s->ctx->sticky;
    }
    s->running = true;
    CUresult r = CUDA_SUCCESS;
    while (!s->queue.empty() && (upto == 0 || s->queue.front().seq <= upto)) {
        Op op = std::move(s->queue.front());
        s->queue.pop_front();
        r = run_op(s, op);
        if (r != CUDA_SUCCESS) break;
    }
    s->running = false;
    return r != CUDA_SUCCESS ? r : s->ctx->sticky;
}

CUresult run_context(Context* c) {
    for (size_t i = 0; i < c->streams.size(); i++) {
        CUresult r = run_stream(c->streams[i]);
        if (r != CUDA_SUCCESS) return r;
    }
    return c->sticky;
}

/// A host synchronisation with all of `s` so far.
static CUresult sync_stream(Stream* s) {
    uint64_t upto = s->next_seq - 1;
    CUresult r = run_stream(s);
    if (r == CUDA_SUCCESS) host_knows(s, upto);
    trim_pool(s->ctx);
    return r;
}

CUresult enqueue(Stream* s, Op op, uint64_t* seq) {
    if (s->host_version != g_host_version) {
        auto b = std::make_shared<VClock>(*s->before);
        merge(*b, g_host);
        s->before = b;
        s->host_version = g_host_version;
    }
    op.seq = s->next_seq++;
    op.before = s->before;
    if (seq != nullptr) *seq = op.seq;
    s->queue.push_back(std::move(op));
    if (g_cfg.launch_blocking) return sync_stream(s);
    return CUDA_SUCCESS;
}

// --- pinned host memory --------------------------------------------------------------------
// Pinned buffers are read and written by queued copies when they run. While a copy into one is
// queued, its pages are inaccessible; while a copy out of one is queued, read-only: a host
// access that would race with the copy faults, and the handler says which copy is pending.

struct Pinned {
    std::atomic<uintptr_t> start{0};
    std::atomic<size_t> len{0};
    int into = 0, from = 0; // queued copies into / out of it
};
static const size_t MAX_PINNED = 4096;
static Pinned g_pinned[MAX_PINNED];
static struct sigaction g_old_segv;
static bool g_handler = false;

static void protect(Pinned& p) {
    int prot = p.into > 0 ? PROT_NONE : p.from > 0 ? PROT_READ : PROT_READ | PROT_WRITE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    mprotect(reinterpret_cast<void*>(p.start.load()), round_up(p.len.load(), page), prot);
}

static void segv(int sig, siginfo_t* info, void* uctx) {
    uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (size_t i = 0; i < MAX_PINNED; i++) {
        uintptr_t st = g_pinned[i].start.load();
        if (st != 0 && addr >= st && addr < st + g_pinned[i].len.load()) {
            char msg[400];
            int n = snprintf(msg, sizeof msg,
                             "softgpu: the host touched pinned memory at %p while a queued copy %s it has not run: "
                             "synchronise the stream (or an event after the copy) before reading, writing or "
                             "reusing the buffer\n",
                             info->si_addr, g_pinned[i].into > 0 ? "into" : "out of");
            ssize_t w = write(2, msg, (size_t)n);
            (void)w;
            if (!g_cfg.log_path.empty()) {
                int fd = open(g_cfg.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
                if (fd >= 0) {
                    w = write(fd, msg, (size_t)n);
                    close(fd);
                }
            }
            signal(SIGABRT, SIG_DFL);
            abort();
        }
    }
    // Not ours: hand the fault to whoever handled it before (Rust's stack-overflow guard).
    if (g_old_segv.sa_flags & SA_SIGINFO) {
        if (g_old_segv.sa_sigaction != nullptr) {
            g_old_segv.sa_sigaction(sig, info, uctx);
            return;
        }
    } else if (g_old_segv.sa_handler != SIG_DFL && g_old_segv.sa_handler != SIG_IGN) {
        g_old_segv.sa_handler(sig);
        return;
    }
    signal(SIGSEGV, SIG_DFL); // the access faults again, and is fatal
}

static Pinned* pinned_of(const void* p, size_t bytes) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (size_t i = 0; i < MAX_PINNED; i++) {
        uintptr_t st = g_pinned[i].start.load();
        if (st != 0 && a >= st && a < st + g_pinned[i].len.load()) {
            return a + bytes <= st + g_pinned[i].len.load() ? &g_pinned[i] : nullptr;
        }
    }
    return nullptr;
}

// --- modules -------------------------------------------------------------------------------

Function* function_of(Context* ctx, CUfunction h, std::string* why) {
    Function* f = reinterpret_cast<Function*>(h);
    if (h == nullptr || g_functions.count(f) == 0) {
        *why = "not a function handle of a loaded module";
        return nullptr;
    }
    Module* m = f->module;
    if (m->unloaded || g_modules.count(m) == 0) {
        *why = "the module of " + f->name + " was unloaded";
        return nullptr;
    }
    if (m->ctx != ctx || m->generation != ctx->generation) {
        *why = f->name + " belongs to a module of cuda:" + std::to_string(m->ctx->device) +
               ", not of the current context (cuda:" + std::to_string(ctx->device) + ")";
        return nullptr;
    }
    return f;
}

} // namespace sg

using namespace sg;

#define LOCK std::lock_guard<std::mutex> lock_(g_mu)
#define INIT_OK                                                                                    \
    do {                                                                                           \
        if (!g_init) return fail(CUDA_ERROR_NOT_INITIALIZED, "cuInit has not been called");        \
    } while (0)
#define CTX_OK(c)                                                                                  \
    do {                                                                                           \
        INIT_OK;                                                                                   \
        CUresult r_ = context_ok(c);                                                               \
        if (r_ != CUDA_SUCCESS) return r_;                                                         \
    } while (0)

// --- initialisation and devices ------------------------------------------------------------

SG_API CUresult cuInit(unsigned int flags) {
    LOCK;
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit: flags must be 0");
    if (!g_init) {
        read_config();
        for (int d = 0; d < g_cfg.devices; d++) {
            auto c = std::make_unique<Context>();
            c->device = d;
            c->pool.device = d;
            g_devices.push_back(std::move(c));
        }
        g_init = true;
    }
    if (g_cfg.devices <= 0) return fail(CUDA_ERROR_NO_DEVICE, "SOFTGPU_DEVICES=0: no device");
    return CUDA_SUCCESS;
}

SG_API CUresult cuDriverGetVersion(int* v) {
    if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

SG_API CUresult cuDeviceGetCount(int* n) {
    LOCK;
    INIT_OK;
    if (n == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount: null pointer");
    *n = (int)g_devices.size();
    return CUDA_SUCCESS;
}

SG_API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    LOCK;
    INIT_OK;
    if (d == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet: null pointer");
    if (ordinal < 0 || ordinal >= (int)g_devices.size()) {
        return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet: no device " + std::to_string(ordinal) + " (there are " +
                                                   std::to_string(g_devices.size()) + ")");
    }
    *d = ordinal;
    return CUDA_SUCCESS;
}

static bool device_ok(CUdevice d) { return d >= 0 && d < (int)g_devices.size(); }

SG_API CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    LOCK;
    INIT_OK;
    if (!device_ok(d)) return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetName: no such device");
    if (name == nullptr || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName: no buffer");
    snprintf(name, (size_t)len, "upcc soft GPU (CPU emulation)");
    return CUDA_SUCCESS;
}

SG_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
    LOCK;
    INIT_OK;
    if (!device_ok(d)) return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceTotalMem_v2: no such device");
    if (bytes == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem_v2: null pointer");
    *bytes = g_cfg.memory_bytes;
    return CUDA_SUCCESS;
}

SG_API CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    LOCK;
    INIT_OK;
    if (!device_ok(d)) return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetAttribute: no such device");
    if (v == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: null pointer");
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = g_cfg.sms; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = g_cfg.major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = g_cfg.minor; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    default:
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuDeviceGetAttribute: the soft GPU does not model attribute " + std::to_string(attr) +
                        " (add it to driver.cpp if upcc needs it)");
    }
    return CUDA_SUCCESS;
}

// --- contexts --------------------------------------------------------------------------------

SG_API CUresult cuDevicePrimaryCtxRetain(CUcontext* out, CUdevice d) {
    LOCK;
    INIT_OK;
    if (!device_ok(d)) return fail(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRetain: no such device");
    if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain: null pointer");
    Context* c = g_devices[(size_t)d].get();
    if (c->retain++ == 0) activate(c);
    *out = reinterpret_cast<CUcontext>(c);
    return CUDA_SUCCESS;
}

SG_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    LOCK;
    INIT_OK;
    if (!device_ok(d)) return fail(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRelease_v2: no such device");
    Context* c = g_devices[(size_t)d].get();
    if (c->retain == 0) {
        return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease_v2: cuda:" + std::to_string(d) +
                                                    "'s primary context is not retained");
    }
    if (--c->retain > 0) return CUDA_SUCCESS;
    // The last release destroys the context: its work finishes, its memory and modules go.
    if (c->sticky == CUDA_SUCCESS) run_context(c);
    for (auto& a : g_alloc_store) {
        if (a->ctx == c && a->state != AllocState::Freed) {
            free_storage(a.get(), "cuDevicePrimaryCtxRelease_v2 (the context was destroyed)");
        }
    }
    for (Module* m : g_modules) {
        if (m->ctx == c) m->unloaded = true;
    }
    for (Stream* s : c->streams) s->destroyed = true;
    c->streams.clear();
    c->active = false;
    c->plain_used = 0;
    c->pool = MemPool{};
    c->pool.device = d;
    if (t_current == c) t_current = nullptr;
    return CUDA_SUCCESS;
}

SG_API CUresult cuCtxGetCurrent(CUcontext* out) {
    LOCK;
    INIT_OK;
    if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent: null pointer");
    *out = reinterpret_cast<CUcontext>(t_current);
    return CUDA_SUCCESS;
}

SG_API CUresult cuCtxSetCurrent(CUcontext h) {
    LOCK;
    INIT_OK;
    if (h == nullptr) {
        t_current = nullptr;
        return CUDA_SUCCESS;
    }
    Context* c = reinterpret_cast<Context*>(h);
    bool known = false;
    for (auto& d : g_devices) known = known || d.get() == c;
    if (!known) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent: not a context");
    if (!c->active) return fail(CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuCtxSetCurrent: the context was released");
    t_current = c;
    return CUDA_SUCCESS;
}

SG_API CUresult cuCtxSynchronize() {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < c->streams.size() && r == CUDA_SUCCESS; i++) r = sync_stream(c->streams[i]);
    trim_pool(c);
    return r;
}

// --- streams and events --------------------------------------------------------------------

SG_API CUresult cuStreamCreate(CUstream* out, unsigned int flags) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: null pointer");
    if (flags != CU_STREAM_NON_BLOCKING) {
        return fail(CUDA_ERROR_NOT_SUPPORTED,
                    "cuStreamCreate: the soft GPU models non-blocking streams only (CU_STREAM_NON_BLOCKING), "
                    "not streams that synchronise with the legacy default stream");
    }
    Stream* s = new Stream(); // never freed: a stale handle stays recognisable as destroyed
    s->id = ++g_stream_ids;
    s->ctx = c;
    s->generation = c->generation;
    g_streams.insert(s);
    c->streams.push_back(s);
    *out = reinterpret_cast<CUstream>(s);
    return CUDA_SUCCESS;
}

SG_API CUresult cuStreamDestroy_v2(CUstream h) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, h, &why);
    if (s == nullptr || s->is_null) {
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy_v2: " + (s ? "the default stream" : why));
    }
    // CUDA finishes a destroyed stream's work; so does the soft GPU, now.
    CUresult r = run_stream(s);
    s->destroyed = true;
    g_streams.erase(s);
    c->streams.erase(std::remove(c->streams.begin(), c->streams.end(), s), c->streams.end());
    return r;
}

SG_API CUresult cuStreamSynchronize(CUstream h) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, h, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize: " + why);
    return sync_stream(s);
}

SG_API CUresult cuEventCreate(CUevent* out, unsigned int flags) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: null pointer");
    if (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)) {
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuEventCreate: flags " + std::to_string(flags) + " are not modelled");
    }
    Event* e = new Event();
    e->ctx = c;
    e->generation = c->generation;
    g_events.insert(e);
    *out = reinterpret_cast<CUevent>(e);
    return CUDA_SUCCESS;
}

static Event* event_of(CUevent h, std::string* why) {
    Event* e = reinterpret_cast<Event*>(h);
    if (h == nullptr || g_events.count(e) == 0) {
        *why = "not a live event";
        return nullptr;
    }
    return e;
}

SG_API CUresult cuEventDestroy_v2(CUevent h) {
    LOCK;
    INIT_OK;
    std::string why;
    Event* e = event_of(h, &why);
    if (e == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy_v2: " + why);
    g_events.erase(e);
    delete e;
    return CUDA_SUCCESS;
}

SG_API CUresult cuEventRecord(CUevent h, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Event* e = event_of(h, &why);
    if (e == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord: " + why);
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord: " + why);
    if (e->ctx != c) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuEventRecord: the event belongs to another context");
    Op op;
    op.what = "cuEventRecord";
    op.run = [](Op&) { return CUDA_SUCCESS; };
    uint64_t seq = 0;
    CUresult r = enqueue(s, std::move(op), &seq);
    e->stream = s;
    e->seq = seq;
    e->clock = *s->before;
    e->clock[s->id] = std::max(e->clock[s->id], seq);
    return r;
}

SG_API CUresult cuEventQuery(CUevent h) {
    LOCK;
    INIT_OK;
    std::string why;
    Event* e = event_of(h, &why);
    if (e == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventQuery: " + why);
    if (e->ctx->sticky != CUDA_SUCCESS) return e->ctx->sticky;
    if (e->stream == nullptr || e->stream->destroyed || e->stream->done_seq >= e->seq) return CUDA_SUCCESS;
    return CUDA_ERROR_NOT_READY;
}

SG_API CUresult cuEventSynchronize(CUevent h) {
    LOCK;
    INIT_OK;
    std::string why;
    Event* e = event_of(h, &why);
    if (e == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize: " + why);
    if (e->ctx->sticky != CUDA_SUCCESS) return e->ctx->sticky;
    if (e->stream == nullptr || e->stream->destroyed) return CUDA_SUCCESS;
    CUresult r = run_stream(e->stream, e->seq);
    if (r != CUDA_SUCCESS) return r;
    for (auto& [sid, seq] : e->clock) {
        uint64_t& x = g_host[sid];
        if (seq > x) {
            x = seq;
            g_host_version++;
        }
    }
    trim_pool(e->ctx);
    return CUDA_SUCCESS;
}

SG_API CUresult cuStreamWaitEvent(CUstream hs, CUevent h, unsigned int flags) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: " + why);
    Event* e = event_of(h, &why);
    if (e == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: " + why);
    if (flags != CU_EVENT_WAIT_DEFAULT) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent: flags must be 0");
    if (e->stream == nullptr || e->stream == s) return CUDA_SUCCESS; // nothing to wait for
    Stream* other = e->stream;
    uint64_t upto = e->seq;
    auto b = std::make_shared<VClock>(*s->before);
    merge(*b, e->clock);
    s->before = b;
    Op op;
    op.what = "cuStreamWaitEvent on " + stream_name(other);
    op.run = [s, other, upto](Op&) {
        if (other->destroyed) return CUDA_SUCCESS;
        g_waiting.push_back(s);
        CUresult r = run_stream(other, upto);
        g_waiting.pop_back();
        return r;
    };
    return enqueue(s, std::move(op));
}

// --- device memory ---------------------------------------------------------------------------

static CUresult allocate(Context* c, size_t bytes, bool pooled, Stream* s, const char* api, CUdeviceptr* out) {
    if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, std::string(api) + ": null pointer");
    if (bytes == 0) {
        return fail(CUDA_ERROR_INVALID_VALUE, std::string(api) + ": 0 bytes asked for (CUDA refuses empty allocations)");
    }
    uint64_t n = ++g_alloc_calls;
    if (g_cfg.fail_alloc != 0 && n == g_cfg.fail_alloc) {
        return fail(CUDA_ERROR_OUT_OF_MEMORY, std::string(api) + ": allocation " + std::to_string(n) + " of " +
                                                  std::to_string(bytes) +
                                                  " bytes refused (fault injected by SOFTGPU_FAIL_ALLOC)");
    }
    uint64_t size = round_up(bytes, 512);
    MemPool& p = c->pool;
    uint64_t in_use = c->plain_used + p.used;
    if (in_use + size > g_cfg.memory_bytes) {
        std::ostringstream m;
        m << api << ": " << bytes << " bytes do not fit: " << in_use << " of cuda:" << c->device << "'s "
          << g_cfg.memory_bytes << " bytes are in use (SOFTGPU_MEMORY_MB sets the size)";
        return fail(CUDA_ERROR_OUT_OF_MEMORY, m.str());
    }
    Alloc* a = new_alloc(c, bytes);
    if (a == nullptr) return fail(CUDA_ERROR_OUT_OF_MEMORY, std::string(api) + ": the host is out of memory");
    a->pooled = pooled;
    if (pooled) {
        p.cached -= std::min(p.cached, size);
        p.used += size;
        p.cached = std::min<uint64_t>(p.cached, g_cfg.memory_bytes - c->plain_used - p.used);
        p.used_high = std::max(p.used_high, p.used);
        p.reserved_high = std::max(p.reserved_high, p.used + p.cached);
    } else {
        c->plain_used += size;
    }
    *out = a->base;
    if (!pooled) {
        a->state = AllocState::Live;
        a->made_by = api;
        return CUDA_SUCCESS;
    }
    a->made_by = std::string(api) + " on " + stream_name(s);
    Op op;
    op.what = std::string(api) + " of allocation #" + std::to_string(a->id);
    op.touches.push_back({a, true});
    op.run = [a](Op&) {
        a->state = AllocState::Live;
        return CUDA_SUCCESS;
    };
    return enqueue(s, std::move(op));
}

SG_API CUresult cuMemAllocAsync(CUdeviceptr* out, size_t bytes, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuMemAllocAsync: " + why);
    return allocate(c, bytes, true, s, "cuMemAllocAsync", out);
}

SG_API CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t bytes) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    return allocate(c, bytes, false, nullptr, "cuMemAlloc_v2", out);
}

static Alloc* freeable(CUdeviceptr p, const char* api, CUresult* r) {
    Alloc* a = find_alloc(p);
    if (a == nullptr || a->base != p) {
        *r = fail(CUDA_ERROR_INVALID_VALUE,
                  std::string(api) + ": " + describe_address(p, 0) + " is not the start of an allocation");
        return nullptr;
    }
    if (a->state == AllocState::Freed || a->free_queued) {
        *r = fail(CUDA_ERROR_INVALID_VALUE, std::string(api) + ": allocation #" + std::to_string(a->id) +
                                                " is freed twice (first by " +
                                                (a->freed_by.empty() ? std::string("a queued cuMemFreeAsync")
                                                                     : a->freed_by) +
                                                ")");
        return nullptr;
    }
    return a;
}

SG_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuMemFreeAsync: " + why);
    CUresult r = CUDA_SUCCESS;
    Alloc* a = freeable(p, "cuMemFreeAsync", &r);
    if (a == nullptr) return r;
    if (a->ctx != c) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync: the allocation belongs to another device");
    a->free_queued = true;
    std::string by = "cuMemFreeAsync on " + stream_name(s);
    Op op;
    op.what = "cuMemFreeAsync of allocation #" + std::to_string(a->id);
    op.touches.push_back({a, true});
    op.run = [a, c, by](Op&) {
        uint64_t size = round_up(a->bytes, 512);
        if (a->pooled) {
            c->pool.used -= size;
            c->pool.cached += size;
        } else {
            c->plain_used -= size;
        }
        free_storage(a, by);
        return CUDA_SUCCESS;
    };
    return enqueue(s, std::move(op));
}

SG_API CUresult cuMemFree_v2(CUdeviceptr p) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    CUresult r = CUDA_SUCCESS;
    Alloc* a = freeable(p, "cuMemFree_v2", &r);
    if (a == nullptr) return r;
    // cuMemFree waits for the device's work that may use the memory.
    r = run_context(c);
    if (r != CUDA_SUCCESS) return r;
    uint64_t size = round_up(a->bytes, 512);
    if (a->pooled) {
        c->pool.used -= size;
        c->pool.cached += size;
    } else {
        c->plain_used -= size;
    }
    free_storage(a, "cuMemFree_v2");
    return CUDA_SUCCESS;
}

SG_API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    if (free_bytes == nullptr || total == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo_v2: null pointer");
    *total = g_cfg.memory_bytes;
    *free_bytes = g_cfg.memory_bytes - c->plain_used - c->pool.used - c->pool.cached;
    return CUDA_SUCCESS;
}

SG_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuMemsetD8Async: " + why);
    if (n == 0) return CUDA_SUCCESS;
    Alloc* a = range_alloc(dst, n, &why);
    if (a == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD8Async: " + why);
    Op op;
    op.what = "cuMemsetD8Async of " + std::to_string(n) + " bytes";
    op.touches.push_back({a, true});
    op.run = [c, dst, value, n](Op& o) {
        std::string w;
        if (!range_live(dst, n, o.what, &w)) return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS, w);
        Alloc* x = find_alloc(dst);
        memset(x->host + (dst - x->base), value, n);
        return CUDA_SUCCESS;
    };
    return enqueue(s, std::move(op));
}

SG_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuMemcpyHtoDAsync_v2: " + why);
    if (n == 0) return CUDA_SUCCESS;
    if (src == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoDAsync_v2: null host pointer");
    Alloc* a = range_alloc(dst, n, &why);
    if (a == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoDAsync_v2: " + why);
    Op op;
    op.what = "cuMemcpyHtoDAsync_v2 of " + std::to_string(n) + " bytes";
    op.touches.push_back({a, true});
    Pinned* pin = pinned_of(src, n);
    if (pin != nullptr) {
        // From pinned memory the copy reads the buffer when it runs.
        pin->from++;
        protect(*pin);
        op.run = [c, dst, src, n, pin](Op& o) {
            pin->from--;
            protect(*pin);
            std::string w;
            if (!range_live(dst, n, o.what, &w)) return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS, w);
            Alloc* x = find_alloc(dst);
            memcpy(x->host + (dst - x->base), src, n);
            return CUDA_SUCCESS;
        };
    } else {
        // From pageable memory CUDA stages the bytes before returning: the caller may reuse its
        // buffer at once.
        auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                          static_cast<const char*>(src) + n);
        op.run = [c, dst, n, staged](Op& o) {
            std::string w;
            if (!range_live(dst, n, o.what, &w)) return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS, w);
            Alloc* x = find_alloc(dst);
            memcpy(x->host + (dst - x->base), staged->data(), n);
            return CUDA_SUCCESS;
        };
    }
    return enqueue(s, std::move(op));
}

SG_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuMemcpyDtoHAsync_v2: " + why);
    if (n == 0) return CUDA_SUCCESS;
    if (dst == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoHAsync_v2: null host pointer");
    Alloc* a = range_alloc(src, n, &why);
    if (a == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoHAsync_v2: " + why);
    Op op;
    op.what = "cuMemcpyDtoHAsync_v2 of " + std::to_string(n) + " bytes";
    op.touches.push_back({a, false});
    Pinned* pin = pinned_of(dst, n);
    if (pin != nullptr) pin->into++;
    op.run = [c, dst, src, n, pin](Op& o) {
        if (pin != nullptr) {
            pin->into--;
            protect(*pin);
        }
        std::string w;
        if (!range_live(src, n, o.what, &w)) return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS, w);
        Alloc* x = find_alloc(src);
        memcpy(dst, x->host + (src - x->base), n);
        return CUDA_SUCCESS;
    };
    uint64_t seq = 0;
    CUresult r = enqueue(s, std::move(op), &seq);
    if (r != CUDA_SUCCESS) return r;
    if (pin != nullptr) {
        protect(*pin); // the host may not touch the buffer until the copy has run
        return CUDA_SUCCESS;
    }
    // Into pageable memory CUDA returns only once the copy is done.
    r = run_stream(s, seq);
    if (r == CUDA_SUCCESS) host_knows(s, seq);
    return r;
}

SG_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuMemcpyDtoDAsync_v2: " + why);
    if (n == 0) return CUDA_SUCCESS;
    Alloc* to = range_alloc(dst, n, &why);
    if (to == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoDAsync_v2: destination: " + why);
    Alloc* from = range_alloc(src, n, &why);
    if (from == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoDAsync_v2: source: " + why);
    if (to == from && dst < src + n && src < dst + n) {
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoDAsync_v2: the source and destination ranges overlap");
    }
    Op op;
    op.what = "cuMemcpyDtoDAsync_v2 of " + std::to_string(n) + " bytes";
    op.touches.push_back({from, false});
    if (to != from) op.touches.push_back({to, true});
    else op.touches.back().write = true;
    op.run = [c, dst, src, n](Op& o) {
        std::string w;
        if (!range_live(src, n, o.what + " (source)", &w) || !range_live(dst, n, o.what + " (destination)", &w)) {
            return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS, w);
        }
        Alloc* x = find_alloc(src);
        Alloc* y = find_alloc(dst);
        memcpy(y->host + (dst - y->base), x->host + (src - x->base), n);
        return CUDA_SUCCESS;
    };
    return enqueue(s, std::move(op));
}

// --- pinned host memory ------------------------------------------------------------------

static CUresult host_alloc(void** out, size_t bytes, const char* api) {
    if (out == nullptr || bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, std::string(api) + ": no pointer or 0 bytes");
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void* m = mmap(nullptr, round_up(bytes, page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return fail(CUDA_ERROR_OUT_OF_MEMORY, std::string(api) + ": the host is out of memory");
    memset(m, 0xFF, bytes);
    for (size_t i = 0; i < MAX_PINNED; i++) {
        if (g_pinned[i].start.load() == 0) {
            g_pinned[i].into = g_pinned[i].from = 0;
            g_pinned[i].len.store(bytes);
            g_pinned[i].start.store(reinterpret_cast<uintptr_t>(m));
            if (!g_handler) {
                struct sigaction sa {};
                sa.sa_sigaction = segv;
                sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
                sigemptyset(&sa.sa_mask);
                sigaction(SIGSEGV, &sa, &g_old_segv);
                g_handler = true;
            }
            *out = m;
            return CUDA_SUCCESS;
        }
    }
    munmap(m, round_up(bytes, page));
    return fail(CUDA_ERROR_OUT_OF_MEMORY, std::string(api) + ": more than 4096 pinned buffers");
}

SG_API CUresult cuMemAllocHost_v2(void** out, size_t bytes) {
    LOCK;
    CTX_OK(t_current);
    return host_alloc(out, bytes, "cuMemAllocHost_v2");
}

SG_API CUresult cuMemHostAlloc(void** out, size_t bytes, unsigned int flags) {
    LOCK;
    CTX_OK(t_current);
    (void)flags;
    return host_alloc(out, bytes, "cuMemHostAlloc");
}

SG_API CUresult cuMemFreeHost(void* p) {
    LOCK;
    INIT_OK;
    for (size_t i = 0; i < MAX_PINNED; i++) {
        if (g_pinned[i].start.load() == reinterpret_cast<uintptr_t>(p) && p != nullptr) {
            if (g_pinned[i].into > 0 || g_pinned[i].from > 0) {
                return fail(CUDA_ERROR_ILLEGAL_STATE,
                            "cuMemFreeHost: a queued copy " + std::string(g_pinned[i].into > 0 ? "into" : "out of") +
                                " this pinned buffer has not run: synchronise its stream before freeing it");
            }
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            size_t len = g_pinned[i].len.load();
            g_pinned[i].start.store(0);
            g_pinned[i].len.store(0);
            munmap(p, round_up(len, page));
            return CUDA_SUCCESS;
        }
    }
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost: not a pinned buffer of cuMemAllocHost/cuMemHostAlloc");
}

// --- the default memory pool ---------------------------------------------------------------

SG_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* out, CUdevice d) {
    LOCK;
    INIT_OK;
    if (!device_ok(d)) return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetDefaultMemPool: no such device");
    if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetDefaultMemPool: null pointer");
    *out = reinterpret_cast<CUmemoryPool>(&g_devices[(size_t)d]->pool);
    return CUDA_SUCCESS;
}

static MemPool* pool_of(CUmemoryPool h) {
    for (auto& d : g_devices) {
        if (reinterpret_cast<CUmemoryPool>(&d->pool) == h) return &d->pool;
    }
    return nullptr;
}

SG_API CUresult cuMemPoolSetAttribute(CUmemoryPool h, int attr, void* value) {
    LOCK;
    INIT_OK;
    MemPool* p = pool_of(h);
    if (p == nullptr || value == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute: no pool or value");
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        p->release_threshold = *static_cast<cuuint64_t*>(value);
        return CUDA_SUCCESS;
    }
    return fail(CUDA_ERROR_NOT_SUPPORTED,
                "cuMemPoolSetAttribute: the soft GPU models the release threshold only (attribute " +
                    std::to_string(attr) + ")");
}

SG_API CUresult cuMemPoolGetAttribute(CUmemoryPool h, int attr, void* value) {
    LOCK;
    INIT_OK;
    MemPool* p = pool_of(h);
    if (p == nullptr || value == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemPoolGetAttribute: no pool or value");
    cuuint64_t v = 0;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = p->used + p->cached; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = p->used_high; break;
    default:
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemPoolGetAttribute: attribute " + std::to_string(attr) +
                                                  " is not modelled");
    }
    *static_cast<cuuint64_t*>(value) = v;
    return CUDA_SUCCESS;
}

// --- modules and launches ------------------------------------------------------------------

SG_API CUresult cuModuleLoadData(CUmodule* out, const void* image) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    if (out == nullptr || image == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: null pointer");
    const unsigned char* b = static_cast<const unsigned char*>(image);
    if (memcmp(b, "\x7f" "ELF", 4) != 0) {
        return fail(CUDA_ERROR_INVALID_IMAGE,
                    "cuModuleLoadData: not an ELF CUBIN (the soft GPU loads NVRTC's machine code, not PTX)");
    }
    // The ELF header says how long the image is: its section headers end it.
    uint64_t shoff = 0;
    uint16_t shentsize = 0, shnum = 0;
    memcpy(&shoff, b + 0x28, 8);
    memcpy(&shentsize, b + 0x3a, 2);
    memcpy(&shnum, b + 0x3c, 2);
    size_t len = (size_t)(shoff + (uint64_t)shentsize * shnum);
    int arch = 0;
    std::vector<CubinKernel> ks;
    std::string why;
    if (!read_cubin(b, len, &arch, &ks, &why)) return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: " + why);
    int want = g_cfg.major * 10 + g_cfg.minor;
    if (arch != want) {
        return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData: the CUBIN is for sm_" + std::to_string(arch) +
                                                      ", the device is sm_" + std::to_string(want));
    }
    auto m = std::make_unique<Module>();
    m->ctx = c;
    m->generation = c->generation;
    m->arch = arch;
    for (CubinKernel& k : ks) {
        const KernelDef* def = find_kernel(k.name);
        if (def == nullptr) {
            return fail(CUDA_ERROR_INVALID_IMAGE,
                        "cuModuleLoadData: kernel " + k.name +
                            " of the CUBIN has no host build in this soft GPU: it was built from another "
                            "cuda_kernels.cu; rebuild it (bash .ci/soft-gpu.sh DIR)");
        }
        bool same = def->params.size() == k.param_sizes.size();
        for (size_t i = 0; same && i < k.param_sizes.size(); i++) same = def->params[i].size == k.param_sizes[i];
        if (!same) {
            std::ostringstream s;
            s << "cuModuleLoadData: kernel " << k.name << " takes parameters of " << k.param_sizes.size()
              << " sizes (";
            for (size_t i = 0; i < k.param_sizes.size(); i++) s << (i ? "," : "") << k.param_sizes[i];
            s << " bytes) in the CUBIN but " << def->params.size() << " (";
            for (size_t i = 0; i < def->params.size(); i++) s << (i ? "," : "") << def->params[i].size;
            s << " bytes) in the soft GPU's host build: rebuild the soft GPU (bash .ci/soft-gpu.sh DIR)";
            return fail(CUDA_ERROR_INVALID_IMAGE, s.str());
        }
        auto f = std::make_unique<Function>();
        f->module = m.get();
        f->def = def;
        f->name = k.name;
        f->param_sizes = k.param_sizes;
        f->param_offsets = k.param_offsets;
        g_functions.insert(f.get());
        m->functions.push_back(std::move(f));
    }
    Module* mp = m.release(); // never freed: a stale handle stays recognisable
    g_modules.insert(mp);
    *out = reinterpret_cast<CUmodule>(mp);
    return CUDA_SUCCESS;
}

SG_API CUresult cuModuleGetFunction(CUfunction* out, CUmodule hm, const char* name) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    Module* m = reinterpret_cast<Module*>(hm);
    if (hm == nullptr || g_modules.count(m) == 0 || m->unloaded) {
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction: not a loaded module");
    }
    if (out == nullptr || name == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: null pointer");
    for (auto& f : m->functions) {
        if (f->name == name) {
            *out = reinterpret_cast<CUfunction>(f.get());
            return CUDA_SUCCESS;
        }
    }
    return fail(CUDA_ERROR_NOT_FOUND, std::string("cuModuleGetFunction: the module has no kernel ") + name);
}

SG_API CUresult cuModuleUnload(CUmodule hm) {
    LOCK;
    Context* c = t_current;
    INIT_OK;
    Module* m = reinterpret_cast<Module*>(hm);
    if (hm == nullptr || g_modules.count(m) == 0 || m->unloaded) {
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload: not a loaded module");
    }
    // Queued launches of its kernels run first.
    if (m->ctx->active && m->ctx->sticky == CUDA_SUCCESS) run_context(m->ctx);
    (void)c;
    m->unloaded = true;
    for (auto& f : m->functions) g_functions.erase(f.get());
    return m->ctx->sticky;
}

SG_API CUresult cuLaunchKernel(CUfunction hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream hs, void** params, void** extra) {
    LOCK;
    Context* c = t_current;
    CTX_OK(c);
    std::string why;
    Function* f = function_of(c, hf, &why);
    if (f == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: " + why);
    Stream* s = stream_of(c, hs, &why);
    if (s == nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel " + f->name + ": " + why);
    std::ostringstream shape;
    shape << "grid (" << gx << "," << gy << "," << gz << "), block (" << bx << "," << by << "," << bz << ")";
    uint64_t threads = (uint64_t)bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || gx > 2147483647u || gy > 65535 || gz > 65535 || bx == 0 || by == 0 ||
        bz == 0 || bx > 1024 || by > 1024 || bz > 64 || threads > 1024) {
        return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel " + f->name + ": " + shape.str() +
                                                  " is outside the launch limits (grid x < 2^31, y and z < 65536; "
                                                  "block x, y <= 1024, z <= 64, at most 1024 threads)");
    }
    if (shared != 0) {
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel " + f->name +
                                                  ": dynamic shared memory is not modelled by the soft GPU");
    }
    if (extra != nullptr) {
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel " + f->name + ": `extra` parameters are not modelled");
    }
    if (params == nullptr && !f->param_sizes.empty()) {
        return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel " + f->name + ": no kernelParams");
    }
    auto L = std::make_shared<LaunchArgs>();
    L->def = f->def;
    L->ctx = c;
    L->grid = {gx, gy, gz};
    L->block = {bx, by, bz};
    L->stream = stream_name(s);
    Op op;
    op.what = f->name + " (cuLaunchKernel, " + shape.str() + ")";
    for (size_t i = 0; i < f->param_sizes.size(); i++) {
        if (params[i] == nullptr) {
            return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel " + f->name + ": parameter " + std::to_string(i) +
                                                      " is a null pointer");
        }
        const char* p = static_cast<const char*>(params[i]);
        L->params.emplace_back(p, p + f->param_sizes[i]);
        const ParamInfo& info = f->def->params[i];
        if (info.pointer) {
            uint64_t addr = 0;
            memcpy(&addr, p, 8);
            Alloc* a = addr != 0 ? find_alloc(addr) : nullptr;
            if (a != nullptr && !info.constant &&
                std::find(L->written.begin(), L->written.end(), a) == L->written.end()) {
                L->written.push_back(a);
            }
            if (a != nullptr) {
                bool merged = false;
                for (Touch& t : op.touches) {
                    if (t.alloc == a) {
                        t.write = t.write || !info.constant;
                        merged = true;
                    }
                }
                if (!merged) op.touches.push_back({a, !info.constant});
            }
        }
    }
    int device = c->device;
    op.run = [L, c, device](Op& o) {
        L->launch_no = (uint32_t)++g_launches;
        uint64_t on_device = ++c->launches;
        if (g_cfg.fault_launch != 0 && on_device == g_cfg.fault_launch && g_cfg.fault_device == device) {
            return poison(c, CUDA_ERROR_ILLEGAL_ADDRESS,
                          "fault injected by SOFTGPU_FAULT_LAUNCH=" + std::to_string(on_device) + " (launch " +
                              std::to_string(on_device) + " on cuda:" + std::to_string(device) + "): " + o.what +
                              " on " + L->stream + " made an illegal address");
        }
        CUresult r = L->def->run(*L);
        if (r == CUDA_SUCCESS) return r;
        std::ostringstream m;
        m << o.what << " on " << L->stream << ": ";
        for (size_t i = 0; i < L->problems.size(); i++) m << (i ? "\n  " : "") << L->problems[i];
        if (L->problem_count > L->problems.size()) {
            m << "\n  (" << L->problem_count << " problems in all; the block stopped after the first)";
        }
        return poison(c, r, m.str());
    };
    return enqueue(s, std::move(op));
}

// --- error strings -------------------------------------------------------------------------

SG_API CUresult cuGetErrorString(CUresult code, const char** out) {
    LOCK;
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::string text = error_text(code);
    auto it = g_detail.find((int)code);
    if (it != g_detail.end()) text += " [softgpu: " + it->second + "]";
    g_strings.push_back(text);
    *out = g_strings.back().c_str();
    return CUDA_SUCCESS;
}

SG_API CUresult cuGetErrorName(CUresult code, const char** out) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *out = error_name(code);
    return CUDA_SUCCESS;
}

// NVRTC (13.x) opens libcuda.so.1 for its kernel cache and asks for the driver's private
// export tables; the soft GPU has none, and NVRTC then compiles without its cache.
SG_API CUresult cuGetExportTable(const void** table, const void* id) {
    (void)id;
    if (table != nullptr) *table = nullptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}
