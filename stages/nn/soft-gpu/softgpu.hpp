// The soft GPU's state, shared by the driver (driver.cpp, exec.cpp, cubin.cpp, the kernels)
// and cuBLAS (cublas.cpp, a separate library that links to this one as cuBLAS links to the
// driver). Everything below is guarded by one mutex, `sg::g_mu`: API calls take it, and a
// stream's queued work runs under it when the host synchronises, so one block of one kernel
// runs at a time in the whole process.
#pragma once
#include "cuda_abi.hpp"

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define SG_API extern "C" __attribute__((visibility("default")))
#define SG_INTERNAL __attribute__((visibility("default")))

namespace sg {

struct Context;
struct Stream;
struct Module;
struct Op;

SG_INTERNAL extern std::mutex g_mu;

/// Settings read from the environment once, at cuInit.
struct Config {
    int devices = 1;
    uint64_t memory_bytes = 16ull << 30;
    int major = 9, minor = 0;
    int sms = 1;
    bool launch_blocking = false;
    bool racecheck = true;
    bool streamcheck = true;
    uint64_t fail_alloc = 0;   // the N-th device allocation fails (0: none)
    uint64_t fault_launch = 0; // the N-th kernel launch on `fault_device` faults (0: none)
    int fault_device = 0;
    std::string log_path;
    bool profile = false;
};
SG_INTERNAL const Config& config();

enum class AllocState : uint8_t { Pending, Live, Freed };

/// Racecheck: the last write to a 4-byte word of an allocation, as the writing thread's tag
/// (kernel_rt.hpp: launch, thread, barriers passed).
using Shadow = uint64_t;

/// A stream-order access to an allocation: which stream's which operation.
struct Access {
    uint64_t stream = 0; // stream id (0: none)
    uint64_t seq = 0;
    std::string what;
};

struct Alloc {
    uint64_t id = 0;
    uint64_t base = 0;
    size_t bytes = 0;
    Context* ctx = nullptr;
    char* host = nullptr;
    AllocState state = AllocState::Pending;
    bool pooled = false;        // cuMemAllocAsync (stream-ordered, from the pool)
    bool free_queued = false;   // a cuMemFreeAsync of it is queued
    std::string made_by;        // "cuMemAllocAsync on stream 3 of cuda:0"
    std::string freed_by;       // "cuMemFreeAsync on stream 3 of cuda:0"
    std::vector<Shadow> shadow; // racecheck; sized on the first kernel write
    // Streamcheck: the last operation that wrote it and, since, the last read by each stream.
    Access last_write;
    std::vector<Access> reads;
};

/// What a queued operation touches: an allocation, and whether it writes it.
struct Touch {
    Alloc* alloc;
    bool write;
};

/// What a stream knows has happened before its next operation: for each other stream, the
/// last of its operations ordered before (by an event wait or a host synchronisation).
using VClock = std::map<uint64_t, uint64_t>;

/// One queued operation of a stream. `run` executes it (under g_mu, at a synchronisation
/// point); it returns CUDA_SUCCESS or an error that poisons the context (a sticky error, as a
/// fault of a real GPU's asynchronous work does).
struct Op {
    uint64_t seq = 0;
    std::string what; // "k_fill (cuLaunchKernel)", "cuMemcpyHtoDAsync_v2 of 4096 bytes"
    std::vector<Touch> touches;
    std::shared_ptr<const VClock> before; // what is ordered before it on other streams
    std::function<CUresult(Op&)> run;
};

struct Stream {
    uint64_t id = 0;
    Context* ctx = nullptr;
    uint64_t generation = 0;
    std::deque<Op> queue;
    uint64_t next_seq = 1;
    uint64_t done_seq = 0; // every op with seq <= this has run
    bool is_null = false;  // the context's legacy default stream (handle 0)
    bool destroyed = false;
    bool running = false;
    std::shared_ptr<const VClock> before = std::make_shared<VClock>();
    uint64_t host_version = 0; // the host knowledge merged into `before`
};

struct Event {
    Context* ctx = nullptr;
    uint64_t generation = 0;
    Stream* stream = nullptr; // the stream of the last record (null: never recorded)
    uint64_t seq = 0;         // ... and its record operation
    VClock clock;             // what the recorded work is ordered after, itself included
};

struct MemPool {
    int device = 0;
    uint64_t release_threshold = 0; // CUDA's default: return everything at each sync
    uint64_t used = 0, cached = 0;  // bytes handed out / freed but kept by the pool
    uint64_t used_high = 0, reserved_high = 0;
    uint64_t released_bytes = 0; // handed back to the "driver" at synchronisations
};

struct Context {
    int device = 0;
    uint64_t generation = 0; // bumped at each activation of the primary context
    int retain = 0;
    bool active = false;
    CUresult sticky = CUDA_SUCCESS;
    std::string sticky_detail;
    std::unique_ptr<Stream> null_stream;
    std::vector<Stream*> streams; // live streams (the null stream included)
    uint64_t plain_used = 0;      // bytes of cuMemAlloc_v2 allocations
    MemPool pool;
    uint64_t launches = 0;        // kernel launches run on this device (fault injection)
};

/// The module of one CUBIN: the kernels its ELF symbol table declares, with the parameter
/// sizes of their `.nv.info` sections.
struct KernelDef;
struct Function {
    Module* module = nullptr;
    const KernelDef* def = nullptr;
    std::string name;
    std::vector<uint32_t> param_sizes;
    std::vector<uint32_t> param_offsets;
};
struct Module {
    Context* ctx = nullptr;
    uint64_t generation = 0;
    int arch = 0;
    std::vector<std::unique_ptr<Function>> functions;
    bool unloaded = false;
};
/// A live function handle of a live module of `ctx`, or null with the reason.
SG_INTERNAL Function* function_of(Context* ctx, CUfunction h, std::string* why);

// --- the driver's internals, for cuBLAS and the kernels ---------------------------------

/// The calling thread's current context (null: none).
SG_INTERNAL Context* current();
/// The stream a handle names in `ctx` (0: the legacy default stream); null if it is not a
/// live stream of `ctx`, with the reason in `why`.
SG_INTERNAL Stream* stream_of(Context* ctx, CUstream h, std::string* why);
/// The allocation holding `addr` (live, pending or freed), or null.
SG_INTERNAL Alloc* find_alloc(uint64_t addr);
/// Queue `op` on `s` (or run it at once when CUDA_LAUNCH_BLOCKING is set); its sequence number.
SG_INTERNAL CUresult enqueue(Stream* s, Op op, uint64_t* seq = nullptr);
/// The calling thread's context, checked: CUDA_ERROR_INVALID_CONTEXT without one, the sticky
/// error of a lost one.
SG_INTERNAL CUresult context_ok(Context* ctx);
/// The allocation that holds all of [addr, addr + bytes), or null with the reason.
SG_INTERNAL Alloc* range_alloc(uint64_t addr, size_t bytes, std::string* why);
/// At run time: whether [addr, addr + bytes) is in a live allocation; else the memcheck report.
SG_INTERNAL bool range_live(uint64_t addr, size_t bytes, const std::string& who, std::string* why);
/// Run `s`'s queue (and what its event waits need) through `upto` (0: all of it).
SG_INTERNAL CUresult run_stream(Stream* s, uint64_t upto = 0);
/// Run every stream of `ctx` empty.
SG_INTERNAL CUresult run_context(Context* ctx);
/// Poison `ctx` with a sticky error; the detail is reported once and shown by cuGetErrorString.
SG_INTERNAL CUresult poison(Context* ctx, CUresult code, const std::string& detail);
/// Report a problem on stderr (and in $SOFTGPU_LOG), prefixed `softgpu: `.
SG_INTERNAL void report(const std::string& message);
/// Remember `detail` as what cuGetErrorString says about `code` from now on.
SG_INTERNAL void set_error_detail(CUresult code, const std::string& detail);
/// `0x...` of a device address, and where it lies relative to allocations.
SG_INTERNAL std::string describe_address(uint64_t addr, size_t size);
/// The name of a stream in messages: `stream 3 of cuda:0`.
SG_INTERNAL std::string stream_name(const Stream* s);
/// The host has seen `s` complete through `seq` (a synchronisation): later work on any stream
/// is ordered after it.
SG_INTERNAL void host_knows(Stream* s, uint64_t seq);

// --- the kernels (kernels.cpp) -------------------------------------------------------------

struct ParamInfo {
    uint32_t size;
    bool pointer;
    bool constant; // `const T*`: the kernel only reads through it
};

/// A kernel compiled for the host: its name, whether it (or a function it calls) has a
/// __syncthreads, its parameters, and how to run one launch of it.
struct LaunchArgs;
struct KernelDef {
    const char* name;
    bool barriers;
    std::vector<ParamInfo> params;
    std::vector<const char*> names; // the parameters' names in the source
    CUresult (*run)(LaunchArgs&);
};
SG_INTERNAL const KernelDef* find_kernel(const std::string& name);
SG_INTERNAL size_t kernel_count();
SG_INTERNAL const KernelDef* kernel_at(size_t i);

struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};

/// One launch, as queued: the kernel, its shape and its parameter bytes.
struct LaunchArgs {
    const KernelDef* def = nullptr;
    Context* ctx = nullptr;
    Dim3 grid, block;
    std::vector<std::vector<char>> params;
    std::vector<Alloc*> written; // allocations a non-const pointer parameter points into
    uint32_t launch_no = 0; // numbered when it runs
    std::string stream;     // for messages
    // Set by the run: the first problems found (memcheck, racecheck, synccheck).
    std::vector<std::string> problems;
    uint64_t problem_count = 0;
    CUresult problem_code = CUDA_SUCCESS;
};

// --- the CUBIN reader (cubin.cpp) ----------------------------------------------------------

struct CubinKernel {
    std::string name;
    std::vector<uint32_t> param_sizes;   // by ordinal
    std::vector<uint32_t> param_offsets; // by ordinal
};
/// Read an ELF CUBIN: its architecture (90 for sm_90) and entry kernels. False, with the
/// reason, if the image is not one.
SG_INTERNAL bool read_cubin(const unsigned char* image, size_t len, int* arch,
                            std::vector<CubinKernel>* kernels, std::string* why);

} // namespace sg
