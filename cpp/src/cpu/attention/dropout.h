#pragma once
// Dropout on the attention weights inside the kernels. Whether weight (b, i, j) is kept is a
// hash of (seed, b·len_q + i, j), not a draw from a stream: the forward and the backward make
// the same mask without storing it, whatever the blocking, the order of the tiles or the
// number of threads. A kept weight is scaled by 1/(1 − p), as torch's dropout does.
//
// The hash: a row key from SplitMix64's finalizer on seed + row·φ64, then per pair of keys
// (2m, 2m + 1) MurmurHash3's 32-bit finalizer of row_key ⊕ m·φ32 (a bijection in m, so the
// pairs of one row never share a value), whose low 16 bits decide key 2m and high 16 bits key
// 2m + 1: a weight is kept when its 16 bits are at least p·2¹⁶ (p rounded to a multiple of
// 2⁻¹⁶). 32-bit integer multiplies and shifts, which vectorize (dropout.cpp); one hash per two
// keys, because at the tutorials' shapes the hashes cost as much as a fifth of the
// forward+backward (benchmarks/attention_cpu.py, table dropout).

#include <cmath>
#include <cstdint>

namespace attnlab::cpu {

struct Dropout {
  double p = 0;  // the probability of dropping a weight; 0: no dropout
  uint64_t seed = 0;
  // The weights written are P, not the P ⊙ D that P·V takes: kept for a backward that makes D
  // again (the small kernels only; see weights_undropped_fit).
  bool weights_undropped = false;
  bool active() const { return p > 0; }
  // Weights whose 16 bits are below it are dropped.
  uint32_t threshold() const {
    const double t = std::nearbyint(p * 65536.0);
    return t >= 65535.0 ? 65535u : static_cast<uint32_t>(t);
  }
  double kept_scale() const { return 1 / (1 - p); }
};

inline uint32_t dropout_row_key(uint64_t seed, int64_t row) {
  uint64_t x = seed + static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x ^ (x >> 32));
}

// The hash of keys 2·pair and 2·pair + 1.
inline uint32_t dropout_hash(uint32_t row_key, int64_t pair) {
  uint32_t h = row_key ^ (static_cast<uint32_t>(pair) * 0x9E3779B9u);
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// Whether key col of the row with this key is kept.
inline bool dropout_keeps(uint32_t row_key, int64_t col, uint32_t threshold) {
  return ((dropout_hash(row_key, col >> 1) >> (16 * (col & 1))) & 0xFFFFu) >= threshold;
}

// x[r·ld + c] for r < rows, c < cols holds weights of rows row0 + r (b·len_q + i) and keys
// col0 + c: kept ones are multiplied by kept (1, or the 1/(1 − p) of kept_scale), dropped ones
// set to zero.
void dropout_rows(const Dropout& d, int64_t row0, int64_t col0, float* x, int64_t rows,
                  int64_t cols, int64_t ld, float kept);
void dropout_rows(const Dropout& d, int64_t row0, int64_t col0, double* x, int64_t rows,
                  int64_t cols, int64_t ld, double kept);
// The same for bfloat16 weights (their bits), dropped ones set to +0, kept ones unchanged.
void dropout_rows(const Dropout& d, int64_t row0, int64_t col0, uint16_t* x, int64_t rows,
                  int64_t cols, int64_t ld);

}  // namespace attnlab::cpu
