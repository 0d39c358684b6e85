// cuda_emulator.h: the CUDA C that smalltrain's kernels use, for g++ on the CPU (see cuda_emulator.py).
//
// Every CUDA thread of a block is a fiber on one OS thread. The scheduler runs each fiber until it reaches a
// barrier (__syncthreads, or the warp barrier inside a shuffle) or returns; a barrier opens when every thread of the
// block (of the warp) that has not returned waits at it. Blocks run one after another, so a static `__shared__`
// variable is the block's shared memory. A fiber runs uninterrupted between barriers, which makes a missing
// __syncthreads show up as a stale read: the kernel sees the worst interleaving rather than a lucky one. Shared
// memory, static and dynamic, is refilled with 0xFF bytes (NaN as a float) for every block, as CuPy's pool is
// poisoned in the GPU tests, so a read of shared memory no thread of the block wrote shows. cp.async (common.cuh's
// st_async_* helpers, their ST_EMULATOR branch) lands only at the wait that covers it.
// Not emulated: inline PTX (__CUDA_ARCH__ is not defined), the memory model between blocks (they never overlap
// here), the GPU's float rounding (FMA contraction, its libm: compare within a tolerance, as the GPU tests do).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define ST_EMULATOR 1   // common.cuh's cp.async helpers call the emulator's (st_emu::async_*)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct uint3 { unsigned x, y, z; };
typedef uint3 dim3;
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// CUDA's min/max overloads (fmin/fmax for floating point: a NaN operand loses, as on the GPU)
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) {
    typedef std::common_type_t<A, B> C;
    if constexpr (std::is_floating_point_v<C>) return std::fmin(C(a), C(b));
    else return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) {
    typedef std::common_type_t<A, B> C;
    if constexpr (std::is_floating_point_v<C>) return std::fmax(C(a), C(b));
    else return C(a) < C(b) ? C(b) : C(a);
}

template <class To, class From> inline To st_emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
    To t;
    memcpy(&t, &v, sizeof(To));
    return t;
}
inline float __int_as_float(int v) { return st_emu_bits<float>(v); }
inline float __uint_as_float(unsigned v) { return st_emu_bits<float>(v); }
inline int __float_as_int(float v) { return st_emu_bits<int>(v); }
inline unsigned __float_as_uint(float v) { return st_emu_bits<unsigned>(v); }
inline double __longlong_as_double(long long v) { return st_emu_bits<double>(v); }
inline long long __double_as_longlong(double v) { return st_emu_bits<long long>(v); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldg(const T* p) { return *p; }
inline void __threadfence() {}   // one OS thread, blocks in sequence: every write is already visible

// Atomics: a fiber is never interrupted between barriers, so a plain read-modify-write is atomic here.
template <class T> inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}

// The fiber switch. On x86-64 a hand-written one (callee-saved registers, the stack pointer, the SSE and x87
// control words): glibc's swapcontext also saves the signal mask, a system call per switch, which made it ~10x
// slower. Elsewhere swapcontext.
#if defined(__x86_64__)
#define ST_EMU_FAST_SWITCH 1
extern "C" void st_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl st_emu_switch
    .hidden st_emu_switch
    .type st_emu_switch, @function
st_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size st_emu_switch, .-st_emu_switch
)");
#endif

namespace st_emu {

enum State { RUNNABLE, AT_SYNCTHREADS, AT_WARP_BARRIER, DONE };

struct AsyncCopy {
    void* dst;
    const void* src;   // null: write zeros
    size_t bytes;
};

struct Fiber {
    std::vector<std::vector<AsyncCopy>> groups;   // cp.async: committed groups, oldest first, then the open one
#if ST_EMU_FAST_SWITCH
    void* sp;
#else
    ucontext_t ctx;
#endif
    State state;
    int line;   // the __syncthreads it waits at, to report threads waiting at different ones
};

#if ST_EMU_FAST_SWITCH
inline void* scheduler_sp;
#else
inline ucontext_t scheduler;
#endif
inline std::vector<Fiber> fibers;
inline std::vector<char> stacks;
inline const size_t stack_bytes = 256 << 10;
inline int current;
inline std::function<void()> body;
inline unsigned char* dynamic_shared_base;   // exactly the launch's bytes (16-aligned), so ASan sees its end
inline size_t dynamic_shared_bytes;
inline unsigned long long exchange[1024];   // a shuffle's values, by thread
inline std::string error;
inline unsigned long long block_serial;                       // counts the blocks run, to poison once per block
// static shared variable -> the block it was poisoned in
inline std::vector<std::pair<void*, unsigned long long>> poisoned;

// Every `__shared__` declaration is followed by this call (cuda_emulator.py adds it): the first thread of a block
// to reach it fills the variable with 0xFF bytes, so that no block reads what an earlier block (or launch) left.
inline void poison_shared(void* p, size_t bytes) {
    for (auto& e : poisoned)
        if (e.first == p) {
            if (e.second != block_serial) {
                memset(p, 0xFF, bytes);
                e.second = block_serial;
            }
            return;
        }
    memset(p, 0xFF, bytes);
    poisoned.emplace_back(p, block_serial);
}

inline void to_scheduler() {
#if ST_EMU_FAST_SWITCH
    st_emu_switch(&fibers[current].sp, scheduler_sp);
#else
    swapcontext(&fibers[current].ctx, &scheduler);
#endif
}

inline void to_fiber(int t) {
#if ST_EMU_FAST_SWITCH
    st_emu_switch(&scheduler_sp, fibers[t].sp);
#else
    swapcontext(&scheduler, &fibers[t].ctx);
#endif
}

inline void wait(State s, int line = 0) {
    fibers[current].state = s;
    fibers[current].line = line;
    to_scheduler();
}

// cp.async (common.cuh's st_async_* helpers): a copy is only queued, and lands when a wait covers it, the latest
// a GPU may complete it, so that a read of shared memory the kernel has not waited for sees the poison.
inline void async_copy(void* dst, const void* src, size_t bytes) {
    auto& g = fibers[current].groups;
    if (g.empty()) g.emplace_back();
    g.back().push_back({dst, src, bytes});
}

inline void async_commit() {
    auto& g = fibers[current].groups;
    if (g.empty()) g.emplace_back();   // an empty group committed
    g.emplace_back();                  // the next open one
}

inline void land(std::vector<AsyncCopy>& group) {
    for (auto& c : group) {
        if (c.src) memcpy(c.dst, c.src, c.bytes);
        else memset(c.dst, 0, c.bytes);
    }
    group.clear();
}

// keep: the most recent committed groups left in flight (cp.async.wait_group keep); -1: all, the open one too
// (cp.async.wait_all). The open group is the last entry once async_commit has started a new one.
inline void async_wait(int keep) {
    auto& g = fibers[current].groups;
    if (g.empty()) return;
    const int committed = (int)g.size() - 1;   // the last entry is the open (uncommitted) group
    const int upto = keep < 0 ? (int)g.size() : std::max(0, committed - keep);
    for (int i = 0; i < upto; ++i) land(g[i]);
    while (g.size() > 1 && g.front().empty()) g.erase(g.begin());
    if (keep < 0) g.clear();
}

inline void start() {
    body();
    for (auto& group : fibers[current].groups) land(group);   // copies never waited for still complete
    fibers[current].groups.clear();
    fibers[current].state = DONE;
#if ST_EMU_FAST_SWITCH
    to_scheduler();   // never returns: the fiber is started afresh for the next block
    __builtin_unreachable();
#endif                // (ucontext: returns to the scheduler through uc_link)
}

// A fresh fiber on stack t that starts in start(): a frame as st_emu_switch leaves it, returning into start().
inline void make_fiber(int t) {
    Fiber& f = fibers[t];
    char* stack = stacks.data() + (size_t)t * stack_bytes;
#if ST_EMU_FAST_SWITCH
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + stack_bytes) & ~uintptr_t(15);
    void** ret = reinterpret_cast<void**>(top - 16);   // 16-aligned: start() sees rsp = 8 mod 16, as after a call
    *ret = reinterpret_cast<void*>(&start);
    void** regs = ret - 6;                              // rbp rbx r12 r13 r14 r15, zero
    for (int i = 0; i < 6; ++i) regs[i] = nullptr;
    uint32_t* csr = reinterpret_cast<uint32_t*>(regs - 1);
    csr[0] = 0x1F80;                                    // MXCSR and the x87 control word at their defaults
    csr[1] = 0x037F;
    f.sp = csr;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = stack_bytes;
    f.ctx.uc_link = &scheduler;
    makecontext(&f.ctx, start, 0);
#endif
    f.groups.clear();   // a launch that stopped on a deadlock may have left copies queued
    f.state = RUNNABLE;
}

inline unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

inline void set_thread(int t) {
    threadIdx.x = t % blockDim.x;
    threadIdx.y = (t / blockDim.x) % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

// One block: every fiber from the top until all have returned. False (and `error`) on a deadlock.
inline bool run_block(int nthreads) {
    for (int t = 0; t < nthreads; ++t) make_fiber(t);
    memset(dynamic_shared_base, 0xFF, dynamic_shared_bytes);
    ++block_serial;
    for (;;) {
        for (int t = 0; t < nthreads; ++t) {
            if (fibers[t].state != RUNNABLE) continue;
            current = t;
            set_thread(t);
            to_fiber(t);
        }
        // every fiber now waits at a barrier or has returned: open the warp barriers whose live lanes all wait
        bool opened = false, any_live = false;
        for (int w = 0; w < nthreads; w += 32) {
            int live = 0, waiting = 0;
            for (int t = w; t < nthreads && t < w + 32; ++t) {
                live += fibers[t].state != DONE;
                waiting += fibers[t].state == AT_WARP_BARRIER;
            }
            any_live |= live > 0;
            if (waiting && waiting == live) {
                for (int t = w; t < nthreads && t < w + 32; ++t) fibers[t].state = RUNNABLE;
                opened = true;
            }
        }
        if (!any_live) return true;
        if (opened) continue;
        // then __syncthreads, once every live thread waits at it, at the same line
        int line = -1;
        for (int t = 0; t < nthreads; ++t) {
            if (fibers[t].state == DONE) continue;
            if (fibers[t].state != AT_SYNCTHREADS || (line >= 0 && fibers[t].line != line)) {
                error = "deadlock in block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) +
                        ", " + std::to_string(blockIdx.z) + "): thread " + std::to_string(t) + " waits at " +
                        (fibers[t].state == AT_SYNCTHREADS ? "__syncthreads on line " + std::to_string(fibers[t].line)
                                                           : std::string("a warp shuffle")) +
                        (line >= 0 ? ", others at __syncthreads on line " + std::to_string(line) : std::string());
                return false;
            }
            line = fibers[t].line;
        }
        for (int t = 0; t < nthreads; ++t)
            if (fibers[t].state == AT_SYNCTHREADS) fibers[t].state = RUNNABLE;
    }
}

template <class... A, size_t... I>
inline void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

// The launcher every generated st_emu_launch_<kernel> calls: dims = grid x, y, z, block x, y, z.
template <class... A>
inline int launch(void (*kernel)(A...), const unsigned* dims, size_t shared_bytes, void** args) {
    gridDim = {dims[0], dims[1], dims[2]};
    blockDim = {dims[3], dims[4], dims[5]};
    const int nthreads = (int)(blockDim.x * blockDim.y * blockDim.z);
    if (nthreads <= 0 || nthreads > 1024) {
        error = "block of " + std::to_string(nthreads) + " threads: expected 1 to 1024";
        return 1;
    }
    if (fibers.size() < (size_t)nthreads) {
        fibers.resize(nthreads);
        stacks.resize((size_t)nthreads * stack_bytes);
    }
    ::operator delete(dynamic_shared_base, std::align_val_t(16));
    dynamic_shared_bytes = shared_bytes;
    dynamic_shared_base = static_cast<unsigned char*>(
        ::operator new(shared_bytes ? shared_bytes : 1, std::align_val_t(16)));
    body = [&] { call(kernel, args, std::index_sequence_for<A...>{}); };
    error.clear();
    for (unsigned z = 0; z < gridDim.z; ++z)
        for (unsigned y = 0; y < gridDim.y; ++y)
            for (unsigned x = 0; x < gridDim.x; ++x) {
                blockIdx = {x, y, z};
                if (!run_block(nthreads)) return 1;
            }
    return 0;
}

template <class... A> inline int param_sizes(void (*)(A...), int* sizes) {
    int i = 0;
    ((sizes[i++] = (int)sizeof(A)), ...);
    return (int)sizeof...(A);
}

}  // namespace st_emu

#define __syncthreads() st_emu::wait(st_emu::AT_SYNCTHREADS, __LINE__)

namespace st_emu {
// A warp shuffle: every lane publishes v, then reads the value of the lane source(lane) names (a lane of the same
// warp, 0..31), as __shfl_*_sync do on the GPU
template <class T, class Source> inline T shuffle(T v, Source source) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    const unsigned t = linear_tid(), lane = t % 32;
    memcpy(&exchange[t], &v, sizeof(T));
    wait(AT_WARP_BARRIER);
    T r;
    memcpy(&r, &exchange[t - lane + source(lane)], sizeof(T));
    wait(AT_WARP_BARRIER);   // every lane has read before the slots are written again
    return r;
}
}  // namespace st_emu

template <class T> inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
    return st_emu::shuffle(v, [&](unsigned lane) {   // outside the lane's segment of `width` lanes: its own value
        const unsigned other = lane ^ (unsigned)lane_mask;
        return other / width == lane / width ? other : lane;
    });
}

template <class T> inline T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
    return st_emu::shuffle(v, [&](unsigned lane) {   // lane src_lane (modulo width) of the lane's segment
        return lane / width * width + (unsigned)src_lane % (unsigned)width;
    });
}

extern "C" const char* st_emu_error() { return st_emu::error.c_str(); }
