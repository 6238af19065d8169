// The CPU emulator of warp_primitives.cuh: see warp_emulator.h for the model.
#include "cuda_emulation/warp_emulator.h"

#include <bit>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define ATTNLAB_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTNLAB_EMULATOR_ASAN 1
#endif
#endif
#if defined(ATTNLAB_EMULATOR_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// ---- fibers ----------------------------------------------------------------------------------
// On x86-64 a switch saves the callee-saved registers on the running stack, stores the stack
// pointer and loads the other one (a few nanoseconds, no system call; glibc's swapcontext also
// sets the signal mask, a system call, and under ASan its interceptor clears the shadow of the
// whole target stack at every switch). Elsewhere: ucontext.
#if defined(__x86_64__)
extern "C" void attnlab_emulator_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl attnlab_emulator_switch_stack
  .hidden attnlab_emulator_switch_stack
  .type attnlab_emulator_switch_stack, @function
attnlab_emulator_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size attnlab_emulator_switch_stack, .-attnlab_emulator_switch_stack
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace attnlab::cuda::emulation {

// ---- 16-bit floating point conversions ------------------------------------------------------

template <>
uint16_t half::from_float(float x) {
  const uint32_t f = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t mag = f & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf, or NaN (kept quiet, the top payload bits kept)
    if (mag == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  }
  // At and above 65520 (halfway between 65504, the largest half, and 2^16) rounding gives inf.
  if (mag >= 0x477ff000u) return sign | 0x7c00u;
  if (mag >= 0x38800000u) {  // a normal half (>= 2^-14)
    const uint32_t exponent = (mag >> 23) - 127u + 15u;
    const uint32_t mantissa = mag & 0x7fffffu;
    uint32_t h = (exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;  // the 13 bits dropped
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may raise the exponent
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half: a multiple of 2^-24. At or below 2^-25 (half of the smallest) → ±0.
  if (mag <= 0x33000000u) return sign;
  const uint32_t full = (mag & 0x7fffffu) | 0x800000u;       // 24-bit significand
  const int e = static_cast<int>(mag >> 23) - 127;            // -25 < e < -14
  const int shift = -(e + 1);                                 // value = full · 2^(e-23) = m · 2^-24
  uint32_t m = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (m & 1u))) ++m;   // 0x400 becomes the smallest normal
  return static_cast<uint16_t>(sign | m);
}

template <>
float half::to_float(uint16_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x8000u) << 16;
  const uint32_t exponent = (b >> 10) & 0x1fu;
  const uint32_t mantissa = b & 0x3ffu;
  if (exponent == 0x1fu) {  // inf or NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent - 15u + 127u) << 23) | (mantissa << 13));
}

template <>
uint16_t bfloat16::from_float(float x) {
  const uint32_t f = std::bit_cast<uint32_t>(x);
  if ((f & 0x7fffffffu) > 0x7f800000u) {  // NaN: quiet it, keep the sign and top payload
    return static_cast<uint16_t>((f >> 16) | 0x0040u);
  }
  const uint32_t rounded = f + 0x7fffu + ((f >> 16) & 1u);  // to nearest even; may reach inf
  return static_cast<uint16_t>(rounded >> 16);
}

template <>
float bfloat16::to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// ---- the scheduler -------------------------------------------------------------------------

namespace {

constexpr int kWarpSize = 32;

[[noreturn]] void fail(const char* format, ...) {
  std::fflush(stdout);
  std::fputs("attnlab warp emulator: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

// What a thread waits at.
enum class Op : uint8_t {
  kNone,
  kBlockSync,
  kShflXor,
  kMmaHalf,
  kMmaBfloat16,
  kLdmatrixX4,
  kLdmatrixX4Trans,
};

const char* op_name(Op op) {
  switch (op) {
    case Op::kNone: return "nothing";
    case Op::kBlockSync: return "block_sync";
    case Op::kShflXor: return "shfl_xor";
    case Op::kMmaHalf: return "mma_m16n8k16<half>";
    case Op::kMmaBfloat16: return "mma_m16n8k16<bfloat16>";
    case Op::kLdmatrixX4: return "ldmatrix_x4";
    case Op::kLdmatrixX4Trans: return "ldmatrix_x4_trans";
  }
  return "?";
}

enum class State : uint8_t { kRunnable, kRunning, kWaiting, kDone };

struct Copy {
  unsigned char* destination;
  const unsigned char* source;  // null when not valid
};

// Room for each fiber's stack (kernels keep arrays of a few hundred floats per thread;
// AddressSanitizer's redzones need more), plus one guard page below it.
#if defined(ATTNLAB_EMULATOR_ASAN)
constexpr size_t kStackBytes = size_t{512} << 10;
#else
constexpr size_t kStackBytes = size_t{128} << 10;
#endif

// Where a fiber (or the launching thread) stopped.
struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;  // its stack pointer, the saved registers and return address on top
#else
  ucontext_t uc;
#endif
};

struct EmulatedThread {
  FiberContext context;  // where the fiber stopped (valid while it is not running)
  unsigned char* stack = nullptr;  // the lowest address of its stack (kStackBytes)
  State state = State::kRunnable;
  Op op = Op::kNone;
  // The arguments of the collective it waits at (pointing into its own stack frame, alive
  // while it waits).
  float shfl_value = 0.0f;
  int shfl_mask = 0;
  float shfl_result = 0.0f;
  float* mma_d = nullptr;
  const uint32_t* mma_a = nullptr;
  const uint32_t* mma_b = nullptr;
  const unsigned char* row_address = nullptr;
  uint32_t* ldmatrix_r = nullptr;
  // cp.async: the open group and the committed ones, oldest first.
  std::vector<Copy> open_group;
  std::deque<std::vector<Copy>> committed;
};

struct AlignedDelete {
  void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(128)); }
};

struct Launch {
  int64_t blocks = 0;
  int64_t block = 0;
  int threads = 0;
  size_t shared_bytes = 0;
  std::unique_ptr<unsigned char[], AlignedDelete> shared;
  const std::function<void()>* body = nullptr;
  std::vector<std::unique_ptr<EmulatedThread>> t;
  // Per warp: how many lanes wait at a collective and at which one (block_sync included),
  // how many lanes have returned.
  std::vector<int> warp_waiting;
  std::vector<Op> warp_op;
  std::vector<int> warp_done;
  int sync_waiting = 0;
  int done = 0;
  LaunchOptions options;
  std::mt19937_64 rng;
  std::vector<int> candidates;
  bool finished = false;
  // The launching thread's context (resumed when all blocks are done) and, under ASan, its
  // stack as the first fiber saw it.
  FiberContext launcher;
  const void* launcher_stack = nullptr;
  size_t launcher_stack_bytes = 0;
  // The fibers' stacks: one mapping, each stack above a guard page.
  unsigned char* stacks = nullptr;
  size_t stacks_bytes = 0;

  Launch() = default;
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
  ~Launch() {
    if (stacks == nullptr) return;
#if defined(ATTNLAB_EMULATOR_ASAN)
    __asan_unpoison_memory_region(stacks, stacks_bytes);  // no stale redzones for a later mapping
#endif
    munmap(stacks, stacks_bytes);
  }
};

// The launch running on this OS thread (every fiber of a launch runs on the thread that called
// launch) and the emulated thread running now.
thread_local Launch* tl_launch = nullptr;
thread_local int tl_index = -1;

// Saves the running context in `from` and resumes `to`, whose stack is [to_stack, +to_bytes).
// `from_ends`: the running fiber is never resumed (ASan drops its fake stack).
void switch_context(FiberContext* from, FiberContext* to, const void* to_stack, size_t to_bytes,
                    bool from_ends = false) {
#if defined(ATTNLAB_EMULATOR_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &fake_stack, to_stack, to_bytes);
#else
  (void)to_stack;
  (void)to_bytes;
  (void)from_ends;
#endif
#if defined(__x86_64__)
  attnlab_emulator_switch_stack(&from->sp, to->sp);
#else
  if (swapcontext(&from->uc, &to->uc) != 0) fail("internal error: swapcontext failed");
#endif
#if defined(ATTNLAB_EMULATOR_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// Fiber i stops running and fiber `next` runs (a no-op when they are the same).
void switch_fiber(Launch& L, int i, int next) {
  if (next == i) return;
  tl_index = next;
  switch_context(&L.t[i]->context, &L.t[next]->context, L.t[next]->stack, kStackBytes);
  tl_index = i;
}

// Fiber i stops running and the launching thread goes on.
void switch_to_launcher(Launch& L, int i) {
  tl_index = -1;
  switch_context(&L.t[i]->context, &L.launcher, L.launcher_stack, L.launcher_stack_bytes);
  tl_index = i;
}

Launch& current(const char* what) {
  if (tl_launch == nullptr) {
    fail("%s called outside emulation::launch (no emulated thread is running here)", what);
  }
  return *tl_launch;
}

void start_block(Launch& L) {
  std::memset(L.shared.get(), 0xff, L.shared_bytes == 0 ? 1 : L.shared_bytes);
  for (auto& t : L.t) {
    t->state = State::kRunnable;
    t->op = Op::kNone;
    t->open_group.clear();
    t->committed.clear();
  }
  std::fill(L.warp_waiting.begin(), L.warp_waiting.end(), 0);
  std::fill(L.warp_op.begin(), L.warp_op.end(), Op::kNone);
  std::fill(L.warp_done.begin(), L.warp_done.end(), 0);
  L.sync_waiting = 0;
  L.done = 0;
}

// The runnable thread to run after thread i, as the schedule says; -1 if none.
int pick_next(Launch& L, int i) {
  const auto runnable = [&](int j) { return L.t[j]->state == State::kRunnable; };
  switch (L.options.schedule) {
    case Schedule::kLowestFirst:
      for (int j = 0; j < L.threads; ++j)
        if (runnable(j)) return j;
      return -1;
    case Schedule::kHighestFirst:
      for (int j = L.threads - 1; j >= 0; --j)
        if (runnable(j)) return j;
      return -1;
    case Schedule::kRandom: {
      L.candidates.clear();
      for (int j = 0; j < L.threads; ++j)
        if (runnable(j)) L.candidates.push_back(j);
      if (L.candidates.empty()) return -1;
      return L.candidates[std::uniform_int_distribution<size_t>(0, L.candidates.size() - 1)(L.rng)];
    }
    case Schedule::kRoundRobin:
      break;
  }
  for (int k = 1; k <= L.threads; ++k) {
    const int j = (i + k) % L.threads;
    if (runnable(j)) return j;
  }
  return -1;
}

// Thread i stops running (it waits or has returned): switch to the next runnable thread (as the
// schedule says), or start the next block, or end the launch (back to the launching thread).
// Returns when thread i runs again.
void switch_away(Launch& L, int i) {
  int next = pick_next(L, i);
  if (next < 0) {
    if (L.done != L.threads) {
      std::string states;
      for (int j = 0; j < L.threads; ++j) {
        const EmulatedThread& t = *L.t[j];
        char entry[64];
        std::snprintf(entry, sizeof entry, " %d:%s", j,
                      t.state == State::kDone ? "returned" : op_name(t.op));
        states.append(entry);
      }
      fail("deadlock in block %lld: no thread can run (thread:state)%s",
           static_cast<long long>(L.block), states.c_str());
    }
    if (L.block + 1 < L.blocks) {
      ++L.block;
      start_block(L);
      next = pick_next(L, L.threads - 1);  // round robin: thread 0
    } else {
      L.finished = true;
    }
  }
  if (next >= 0) {
    L.t[next]->state = State::kRunning;
    switch_fiber(L, i, next);
  } else {
    switch_to_launcher(L, i);
  }
}

void finish_thread(Launch& L, int i) {
  const int warp = i / kWarpSize;
  if (L.sync_waiting > 0) {
    int waiter = 0;
    while (L.t[waiter]->op != Op::kBlockSync) ++waiter;
    fail("deadlock in block %lld: thread %d returned from the kernel while %d thread(s) wait at "
         "block_sync (thread %d among them), which needs every thread of the block",
         static_cast<long long>(L.block), i, L.sync_waiting, waiter);
  }
  if (L.warp_waiting[warp] > 0) {
    fail("deadlock in block %lld: lane %d of warp %d (thread %d) returned from the kernel while "
         "%d lane(s) of its warp wait at %s, which needs all 32 lanes",
         static_cast<long long>(L.block), i % kWarpSize, warp, i, L.warp_waiting[warp],
         op_name(L.warp_op[warp]));
  }
  L.t[i]->state = State::kDone;
  L.t[i]->open_group.clear();  // copies never committed, or not waited for, never land
  L.t[i]->committed.clear();
  ++L.done;
  ++L.warp_done[warp];
  switch_away(L, i);
}

// The body of every fiber: runs the kernel once per block until the launch is finished.
void fiber_main() {
#if defined(ATTNLAB_EMULATOR_ASAN)
  const void* from_stack = nullptr;
  size_t from_bytes = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_stack, &from_bytes);
#endif
  Launch& L = *tl_launch;
  const int i = tl_index;
#if defined(ATTNLAB_EMULATOR_ASAN)
  if (L.launcher_stack == nullptr) {  // the first fiber is started by the launching thread
    L.launcher_stack = from_stack;
    L.launcher_stack_bytes = from_bytes;
  }
#endif
  while (!L.finished) {
    try {
      (*L.body)();
    } catch (const std::exception& e) {
      fail("thread %d of block %lld: the kernel threw: %s", i, static_cast<long long>(L.block),
           e.what());
    } catch (...) {
      fail("thread %d of block %lld: the kernel threw a non-standard exception", i,
           static_cast<long long>(L.block));
    }
    finish_thread(L, i);
  }
  // Back to the launching thread for good (a fiber's function must never return).
  tl_index = -1;
  switch_context(&L.t[i]->context, &L.launcher, L.launcher_stack, L.launcher_stack_bytes,
                 /*from_ends=*/true);
  fail("internal error: a finished fiber was resumed");
}

// ---- collectives ---------------------------------------------------------------------------

uint16_t low(uint32_t x) { return static_cast<uint16_t>(x & 0xffffu); }
uint16_t high(uint32_t x) { return static_cast<uint16_t>(x >> 16); }

template <typename T>
double value(uint16_t bits) {
  return static_cast<double>(T::to_float(bits));
}

// D = A·B + C for the warp whose first thread is `base` (layouts of warp_primitives.cuh).
template <typename T>
void run_mma(Launch& L, int base) {
  double a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < kWarpSize; ++lane) {
    const EmulatedThread& t = *L.t[base + lane];
    const int g = lane / 4, q = lane % 4;
    const uint32_t* af = t.mma_a;
    const uint32_t* bf = t.mma_b;
    a[g][2 * q] = value<T>(low(af[0]));
    a[g][2 * q + 1] = value<T>(high(af[0]));
    a[g + 8][2 * q] = value<T>(low(af[1]));
    a[g + 8][2 * q + 1] = value<T>(high(af[1]));
    a[g][2 * q + 8] = value<T>(low(af[2]));
    a[g][2 * q + 9] = value<T>(high(af[2]));
    a[g + 8][2 * q + 8] = value<T>(low(af[3]));
    a[g + 8][2 * q + 9] = value<T>(high(af[3]));
    b[2 * q][g] = value<T>(low(bf[0]));
    b[2 * q + 1][g] = value<T>(high(bf[0]));
    b[2 * q + 8][g] = value<T>(low(bf[1]));
    b[2 * q + 9][g] = value<T>(high(bf[1]));
    c[g][2 * q] = t.mma_d[0];
    c[g][2 * q + 1] = t.mma_d[1];
    c[g + 8][2 * q] = t.mma_d[2];
    c[g + 8][2 * q + 1] = t.mma_d[3];
  }
  float d[16][8];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double sum = c[m][n];
      for (int k = 0; k < 16; ++k) sum += a[m][k] * b[k][n];
      d[m][n] = static_cast<float>(sum);
    }
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    float* out = L.t[base + lane]->mma_d;
    const int g = lane / 4, q = lane % 4;
    out[0] = d[g][2 * q];
    out[1] = d[g][2 * q + 1];
    out[2] = d[g + 8][2 * q];
    out[3] = d[g + 8][2 * q + 1];
  }
}

void run_ldmatrix(Launch& L, int base, bool trans) {
  uint16_t m[4][8][8];  // matrix, row, column
  for (int lane = 0; lane < kWarpSize; ++lane) {
    std::memcpy(m[lane / 8][lane % 8], L.t[base + lane]->row_address, 16);
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    uint32_t* r = L.t[base + lane]->ldmatrix_r;
    const int g = lane / 4, q = lane % 4;
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = trans ? m[k][2 * q][g] : m[k][g][2 * q];
      const uint16_t hi = trans ? m[k][2 * q + 1][g] : m[k][g][2 * q + 1];
      r[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

void run_shfl(Launch& L, int base) {
  for (int lane = 0; lane < kWarpSize; ++lane) {
    EmulatedThread& t = *L.t[base + lane];
    t.shfl_result = L.t[base + (lane ^ t.shfl_mask)]->shfl_value;
  }
}

// This thread (its arguments already stored) arrives at warp collective `op`; returns when the
// collective is done.
void arrive_warp(Op op) {
  Launch& L = *tl_launch;
  const int i = tl_index;
  const int warp = i / kWarpSize;
  const int base = warp * kWarpSize;
  if (L.warp_done[warp] > 0) {
    int gone = base;
    while (L.t[gone]->state != State::kDone) ++gone;
    fail("deadlock in block %lld: lane %d of warp %d (thread %d) arrives at %s, which needs all "
         "32 lanes, but lane %d has returned from the kernel",
         static_cast<long long>(L.block), i % kWarpSize, warp, i, op_name(op), gone - base);
  }
  if (L.warp_waiting[warp] > 0 && L.warp_op[warp] != op) {
    fail("divergence in block %lld, warp %d: lane %d (thread %d) arrives at %s while %d lane(s) "
         "of the warp wait at %s",
         static_cast<long long>(L.block), warp, i % kWarpSize, i, op_name(op),
         L.warp_waiting[warp], op_name(L.warp_op[warp]));
  }
  EmulatedThread& me = *L.t[i];
  me.op = op;
  L.warp_op[warp] = op;
  if (++L.warp_waiting[warp] < kWarpSize) {
    me.state = State::kWaiting;
    switch_away(L, i);
    return;  // the last lane computed the results and made this thread runnable
  }
  switch (op) {
    case Op::kShflXor: run_shfl(L, base); break;
    case Op::kMmaHalf: run_mma<half>(L, base); break;
    case Op::kMmaBfloat16: run_mma<bfloat16>(L, base); break;
    case Op::kLdmatrixX4: run_ldmatrix(L, base, false); break;
    case Op::kLdmatrixX4Trans: run_ldmatrix(L, base, true); break;
    default: fail("internal error: %s is not a warp collective", op_name(op));
  }
  L.warp_waiting[warp] = 0;
  L.warp_op[warp] = Op::kNone;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    EmulatedThread& t = *L.t[base + lane];
    t.op = Op::kNone;
    t.state = State::kRunnable;
  }
  me.state = State::kRunning;
}

// A 16-byte row of shared memory: aligned and inside the block's buffer.
void check_shared_row(const Launch& L, const void* p, const char* what, int i) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  const auto begin = reinterpret_cast<uintptr_t>(L.shared.get());
  if (address < begin || address + 16 > begin + L.shared_bytes) {
    fail("%s: thread %d of block %lld gives shared address %p, outside the block's shared "
         "buffer [%p, +%zu bytes) (16 bytes from it must fit)",
         what, i, static_cast<long long>(L.block), p, static_cast<const void*>(L.shared.get()),
         L.shared_bytes);
  }
  if (address % 16 != 0) {
    fail("%s: thread %d of block %lld gives shared address %p (byte offset %zu), not 16-byte "
         "aligned",
         what, i, static_cast<long long>(L.block), p, static_cast<size_t>(address - begin));
  }
}

void ldmatrix(uint32_t (&r)[4], const void* row_address, bool trans) {
  const char* what = trans ? "ldmatrix_x4_trans" : "ldmatrix_x4";
  Launch& L = current(what);
  EmulatedThread& me = *L.t[tl_index];
  check_shared_row(L, row_address, what, tl_index);
  me.row_address = static_cast<const unsigned char*>(row_address);
  me.ldmatrix_r = r;
  arrive_warp(trans ? Op::kLdmatrixX4Trans : Op::kLdmatrixX4);
}

template <typename T>
void mma(Op op, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  Launch& L = current(op_name(op));
  EmulatedThread& me = *L.t[tl_index];
  me.mma_d = d;
  me.mma_a = a;
  me.mma_b = b;
  arrive_warp(op);
}

void land(const Copy& copy) {
  if (copy.source != nullptr) {
    std::memcpy(copy.destination, copy.source, 16);
  } else {
    std::memset(copy.destination, 0, 16);
  }
}

// Makes t's context start fiber_main on t's stack.
#if defined(__x86_64__)
void make_fiber(EmulatedThread& t) {
  // The stack as attnlab_emulator_switch_stack leaves it: r15, r14, r13, r12, rbx, rbp (all 0),
  // then the return address, fiber_main, at a 16-byte aligned address (so that fiber_main
  // starts as if called: rsp + 8 aligned), then a zero above it.
  auto* top = reinterpret_cast<uintptr_t*>(t.stack + kStackBytes);  // 16-byte aligned
  uintptr_t* sp = top - 8;
  for (int k = 0; k < 6; ++k) sp[k] = 0;
  sp[6] = reinterpret_cast<uintptr_t>(&fiber_main);
  sp[7] = 0;
  t.context.sp = sp;
}
#else
// Out of line: getcontext returns twice (never here: the context is only resumed after
// makecontext), which would keep the compiler from keeping the caller's variables in registers.
[[gnu::noinline]] void make_fiber(EmulatedThread& t) {
  if (getcontext(&t.context.uc) != 0) fail("internal error: getcontext failed");
  t.context.uc.uc_stack.ss_sp = t.stack;
  t.context.uc.uc_stack.ss_size = kStackBytes;
  t.context.uc.uc_link = nullptr;  // fiber_main never returns
  makecontext(&t.context.uc, fiber_main, 0);
}
#endif

}  // namespace

// ---- public entry points -------------------------------------------------------------------

void launch_function(int64_t blocks, int threads_per_block, size_t shared_bytes,
                     const std::function<void()>& body, LaunchOptions options) {
  if (tl_launch != nullptr) {
    throw std::invalid_argument("emulation::launch: called from inside an emulated kernel");
  }
  if (blocks < 0) {
    throw std::invalid_argument("emulation::launch: blocks must be >= 0, got " +
                                std::to_string(blocks));
  }
  if (threads_per_block < kWarpSize || threads_per_block > 1024 ||
      threads_per_block % kWarpSize != 0) {
    throw std::invalid_argument(
        "emulation::launch: threads_per_block must be a multiple of 32 in [32, 1024], got " +
        std::to_string(threads_per_block));
  }
  if (!body) throw std::invalid_argument("emulation::launch: body is empty");
  if (blocks == 0) return;

  Launch L;
  L.blocks = blocks;
  L.threads = threads_per_block;
  L.shared_bytes = shared_bytes;
  L.shared.reset(static_cast<unsigned char*>(
      ::operator new[](shared_bytes == 0 ? 1 : shared_bytes, std::align_val_t(128))));
  L.body = &body;
  L.options = options;
  L.rng.seed(options.seed);
  const int warps = threads_per_block / kWarpSize;
  L.warp_waiting.assign(warps, 0);
  L.warp_op.assign(warps, Op::kNone);
  L.warp_done.assign(warps, 0);
  // One fiber per emulated thread, each with its own stack above a guard page, made once and
  // reused by every block.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t slot = kStackBytes + page;
  L.stacks_bytes = slot * static_cast<size_t>(threads_per_block);
  void* stacks = mmap(nullptr, L.stacks_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) throw std::bad_alloc();
  L.stacks = static_cast<unsigned char*>(stacks);
  for (int i = 0; i < threads_per_block; ++i) {
    auto t = std::make_unique<EmulatedThread>();
    unsigned char* guard = L.stacks + slot * static_cast<size_t>(i);
    if (mprotect(guard, page, PROT_NONE) != 0) throw std::bad_alloc();
    t->stack = guard + page;
    make_fiber(*t);
    L.t.push_back(std::move(t));
  }
  start_block(L);
  const int first = pick_next(L, threads_per_block - 1);  // round robin: thread 0

  // The fibers run on this thread, one at a time, until all blocks are done.
  struct Reset {
    ~Reset() {
      tl_launch = nullptr;
      tl_index = -1;
    }
  } reset;
  tl_launch = &L;
  L.t[first]->state = State::kRunning;
  tl_index = first;
  switch_context(&L.launcher, &L.t[first]->context, L.t[first]->stack, kStackBytes);
  // Every fiber is stopped in switch_away now; resume each so that it sees `finished` and ends
  // (its function returns to the launching thread, and ASan forgets its stack frames).
  for (int i = 0; i < threads_per_block; ++i) {
    tl_index = i;
    switch_context(&L.launcher, &L.t[i]->context, L.t[i]->stack, kStackBytes);
  }
}

unsigned char* shared_memory() { return current("ATTNLAB_DYNAMIC_SHARED").shared.get(); }

size_t shared_memory_bytes() { return current("shared_memory_bytes").shared_bytes; }

namespace detail {

void cp_async_wait_groups(int pending) {
  Launch& L = current("cp_async_wait");
  EmulatedThread& me = *L.t[tl_index];
  while (me.committed.size() > static_cast<size_t>(pending)) {
    for (const Copy& copy : me.committed.front()) land(copy);
    me.committed.pop_front();
  }
}

}  // namespace detail
}  // namespace attnlab::cuda::emulation

namespace attnlab::cuda::detail {

namespace emu = ::attnlab::cuda::emulation;

int thread_index() {
  emu::current("thread_index");
  return emu::tl_index;
}

int64_t block_index() { return emu::current("block_index").block; }

void block_sync() {
  emu::Launch& L = emu::current("block_sync");
  const int i = emu::tl_index;
  const int warp = i / emu::kWarpSize;
  if (L.warp_waiting[warp] > 0 && L.warp_op[warp] != emu::Op::kBlockSync) {
    emu::fail("divergence in block %lld, warp %d: lane %d (thread %d) arrives at block_sync while "
              "%d lane(s) of the warp wait at %s",
              static_cast<long long>(L.block), warp, i % emu::kWarpSize, i, L.warp_waiting[warp],
              emu::op_name(L.warp_op[warp]));
  }
  if (L.done > 0) {
    int gone = 0;
    while (L.t[gone]->state != emu::State::kDone) ++gone;
    emu::fail("deadlock in block %lld: thread %d arrives at block_sync, which needs every thread "
              "of the block, but thread %d has returned from the kernel",
              static_cast<long long>(L.block), i, gone);
  }
  emu::EmulatedThread& me = *L.t[i];
  me.op = emu::Op::kBlockSync;
  L.warp_op[warp] = emu::Op::kBlockSync;
  ++L.warp_waiting[warp];
  if (++L.sync_waiting < L.threads) {
    me.state = emu::State::kWaiting;
    emu::switch_away(L, i);
    return;
  }
  L.sync_waiting = 0;
  std::fill(L.warp_waiting.begin(), L.warp_waiting.end(), 0);
  std::fill(L.warp_op.begin(), L.warp_op.end(), emu::Op::kNone);
  for (auto& t : L.t) {
    t->op = emu::Op::kNone;
    t->state = emu::State::kRunnable;
  }
  me.state = emu::State::kRunning;
}

float shfl_xor(float x, int lane_mask) {
  emu::Launch& L = emu::current("shfl_xor");
  if (lane_mask < 0 || lane_mask >= emu::kWarpSize) {
    emu::fail("shfl_xor: thread %d of block %lld gives lane_mask %d; expected 0 <= lane_mask < 32",
              emu::tl_index, static_cast<long long>(L.block), lane_mask);
  }
  emu::EmulatedThread& me = *L.t[emu::tl_index];
  me.shfl_value = x;
  me.shfl_mask = lane_mask;
  emu::arrive_warp(emu::Op::kShflXor);
  return me.shfl_result;
}

template <>
uint32_t pack_rn<emu::half>(float lo, float hi) {
  return static_cast<uint32_t>(emu::half::from_float(lo)) |
         (static_cast<uint32_t>(emu::half::from_float(hi)) << 16);
}

template <>
uint32_t pack_rn<emu::bfloat16>(float lo, float hi) {
  return static_cast<uint32_t>(emu::bfloat16::from_float(lo)) |
         (static_cast<uint32_t>(emu::bfloat16::from_float(hi)) << 16);
}

template <>
void mma_m16n8k16<emu::half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu::mma<emu::half>(emu::Op::kMmaHalf, d, a, b);
}

template <>
void mma_m16n8k16<emu::bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                 const uint32_t (&b)[2]) {
  emu::mma<emu::bfloat16>(emu::Op::kMmaBfloat16, d, a, b);
}

void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
  emu::ldmatrix(r, row_address, false);
}

void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_address) {
  emu::ldmatrix(r, row_address, true);
}

void cp_async_16(void* shared, const void* global, bool valid) {
  emu::Launch& L = emu::current("cp_async_16");
  const int i = emu::tl_index;
  emu::check_shared_row(L, shared, "cp_async_16", i);
  if (valid && reinterpret_cast<uintptr_t>(global) % 16 != 0) {
    emu::fail("cp_async_16: thread %d of block %lld gives global address %p, not 16-byte aligned",
              i, static_cast<long long>(L.block), global);
  }
  auto* destination = static_cast<unsigned char*>(shared);
  std::memset(destination, 0xff, 16);  // NaN in float16 and bfloat16 until the copy lands
  L.t[i]->open_group.push_back(
      {destination, valid ? static_cast<const unsigned char*>(global) : nullptr});
}

void cp_async_commit() {
  emu::Launch& L = emu::current("cp_async_commit");
  emu::EmulatedThread& me = *L.t[emu::tl_index];
  me.committed.push_back(std::move(me.open_group));
  me.open_group.clear();
}

}  // namespace attnlab::cuda::detail
