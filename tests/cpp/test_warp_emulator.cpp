// The CPU emulator of the warp-level CUDA primitives (tests/cpp/cuda_emulation) against the PTX
// ISA's documented behaviour. The register layouts are written out here from the PTX ISA tables
// ("Matrix Fragments for mma.m16n8k16 with floating point type" and the fragment figures of
// "ldmatrix"), independently of the emulator's code; the references are float64 products and
// torch's own float16 / bfloat16 conversions (c10::Half, c10::BFloat16).
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "cuda_emulation/warp_emulator.h"

namespace {

namespace emu = attnlab::cuda::emulation;
namespace dev = attnlab::cuda::detail;

using emu::bfloat16;
using emu::half;

// ---- references ----------------------------------------------------------------------------

// torch's conversions as the reference for each storage type.
template <typename T>
struct Reference;
template <>
struct Reference<half> {
  static uint16_t bits(float x) { return c10::Half(x).x; }
  static float value(uint16_t b) { return static_cast<float>(c10::Half(b, c10::Half::from_bits())); }
  static constexpr const char* name = "float16";
};
template <>
struct Reference<bfloat16> {
  static uint16_t bits(float x) { return c10::BFloat16(x).x; }
  static float value(uint16_t b) {
    return static_cast<float>(c10::BFloat16(b, c10::BFloat16::from_bits()));
  }
  static constexpr const char* name = "bfloat16";
};

uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }

// A matrix of 16-bit values (raw bits), row major, with values drawn uniformly from
// [-range, range] and rounded to T by torch.
template <typename T>
std::vector<uint16_t> random_matrix(std::mt19937& rng, int rows, int cols, float range = 2.0f) {
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<uint16_t> m(static_cast<size_t>(rows) * cols);
  for (auto& x : m) x = Reference<T>::bits(u(rng));
  return m;
}

// PTX ISA, mma.m16n8k16 with .f16 / .bf16 multiplicands and .f32 accumulators; with
// groupID = lane >> 2 and threadID_in_group = lane % 4:
//   A element a_i (i = 0..7; register i / 2, low half when i is even):
//     row = groupID for 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise
//     col = threadID_in_group * 2 + (i & 1) for i < 4, the same + 8 for i >= 4
//   B element b_i (i = 0..3; register i / 2):
//     row = threadID_in_group * 2 + (i & 1) for i < 2, the same + 8 for i >= 2;  col = groupID
//   C/D element c_i (i = 0..3):
//     row = groupID for i < 2, groupID + 8 for i >= 2;  col = threadID_in_group * 2 + (i & 1)
struct RowCol {
  int row, col;
};
RowCol a_element(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  const int row = ((i < 2) || (i >= 4 && i < 6)) ? group : group + 8;
  const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
  return {row, col};
}
RowCol b_element(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  return {tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), group};
}
RowCol c_element(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  return {i < 2 ? group : group + 8, tig * 2 + (i & 1)};
}

// ldmatrix .m8n8 .b16 (PTX ISA, "ldmatrix" fragment figure): of each 8 × 8 matrix, lane l
// receives in its register the elements at row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low
// half first); with .trans the matrix is read column-major: column l / 4, rows 2 (l % 4) and
// 2 (l % 4) + 1. Matrix m's row addresses come from lanes 8m .. 8m + 7.
RowCol ldmatrix_element(int lane, int half_index, bool trans) {
  const int a = lane / 4, b = 2 * (lane % 4) + half_index;
  return trans ? RowCol{b, a} : RowCol{a, b};
}

// ---- conversions ---------------------------------------------------------------------------

template <typename T>
void expect_conversions_match_torch() {
  // Every 16-bit pattern to float, and back.
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float expected = Reference<T>::value(bits);
    const float got = T::to_float(bits);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << Reference<T>::name << " bits " << b;
      ASSERT_TRUE(std::isnan(T::to_float(T::from_float(got)))) << b;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected))
        << Reference<T>::name << " bits " << b;
    ASSERT_EQ(T::from_float(got), bits) << Reference<T>::name << " round trip of bits " << b;
  }
  // Random float bit patterns (every exponent) and the points halfway between neighbours.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> u;
  for (int n = 0; n < 200000; ++n) {
    const float x = std::bit_cast<float>(u(rng));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(T::to_float(T::from_float(x))));
      continue;
    }
    ASSERT_EQ(T::from_float(x), Reference<T>::bits(x)) << Reference<T>::name << " of " << x;
  }
  for (uint32_t b = 0; b < 0x7c00u; b += 3) {  // finite, positive; ties and their neighbours
    const double lo = Reference<T>::value(static_cast<uint16_t>(b));
    const double hi = Reference<T>::value(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) {
      ASSERT_EQ(T::from_float(x), Reference<T>::bits(x)) << Reference<T>::name << " of " << x;
    }
  }
}

TEST(WarpEmulator, HalfConversionsMatchTorch) {
  expect_conversions_match_torch<half>();
  // Hand-checked points: the largest half, the inf threshold, subnormals and ties to even.
  EXPECT_EQ(half::from_float(65504.0f), 0x7bffu);
  EXPECT_EQ(half::from_float(65519.99f), 0x7bffu);
  EXPECT_EQ(half::from_float(65520.0f), 0x7c00u);
  EXPECT_EQ(half::from_float(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_EQ(half::from_float(std::ldexp(1.0f, -24)), 0x0001u);
  EXPECT_EQ(half::from_float(std::ldexp(1.0f, -25)), 0x0000u);       // tie → even (0)
  EXPECT_EQ(half::from_float(std::ldexp(3.0f, -25)), 0x0002u);       // 1.5 units → 2
  EXPECT_EQ(half::from_float(std::ldexp(1023.5f, -24)), 0x0400u);    // up to the smallest normal
  EXPECT_EQ(half::from_float(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);  // tie → even
  EXPECT_EQ(half::from_float(1.0f + std::ldexp(3.0f, -11)), 0x3c02u);  // tie → even (up)
  EXPECT_EQ(half::from_float(-0.0f), 0x8000u);
  EXPECT_TRUE(std::isnan(half::to_float(half::from_float(std::nanf("")))));
  EXPECT_EQ(half::to_float(0x0001u), std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(half(0.333333f)), half::to_float(0x3555u));
}

TEST(WarpEmulator, Bfloat16ConversionsMatchTorch) {
  expect_conversions_match_torch<bfloat16>();
  EXPECT_EQ(bfloat16::from_float(1.0f), 0x3f80u);
  EXPECT_EQ(bfloat16::from_float(std::bit_cast<float>(0x3f808000u)), 0x3f80u);  // tie → even
  EXPECT_EQ(bfloat16::from_float(std::bit_cast<float>(0x3f818000u)), 0x3f82u);  // tie → even
  EXPECT_EQ(bfloat16::from_float(std::bit_cast<float>(0x7f7fffffu)), 0x7f80u);  // → inf
  EXPECT_TRUE(std::isnan(bfloat16::to_float(bfloat16::from_float(std::nanf("")))));
}

TEST(WarpEmulator, PackRnRoundsAndPutsLoInTheLowHalf) {
  EXPECT_EQ(dev::pack_rn<half>(1.0f, -2.0f), 0xc0003c00u);
  EXPECT_EQ(dev::pack_rn<bfloat16>(1.0f, -2.0f), 0xc0003f80u);
  const float tie = 1.0f + std::ldexp(1.0f, -11);  // halfway between two halves: to even
  EXPECT_EQ(dev::pack_rn<half>(tie, 0.0f), 0x00003c00u);
  const float x = 0.1f, y = -1e-6f;
  EXPECT_EQ(dev::pack_rn<half>(x, y), pack(c10::Half(x).x, c10::Half(y).x));
  EXPECT_EQ(dev::pack_rn<bfloat16>(x, y), pack(c10::BFloat16(x).x, c10::BFloat16(y).x));
}

TEST(WarpEmulator, FastExp2) {
  EXPECT_EQ(dev::fast_exp2(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_FALSE(std::signbit(dev::fast_exp2(-std::numeric_limits<float>::infinity())));
  EXPECT_EQ(dev::fast_exp2(3.0f), 8.0f);
  EXPECT_EQ(dev::fast_exp2(-1.0f), 0.5f);
  for (float x = -30.0f; x < 30.0f; x += 0.37f) {
    const double expected = std::exp2(static_cast<double>(x));
    EXPECT_NEAR(dev::fast_exp2(x), expected, 2e-7 * expected) << x;
  }
}

// ---- mma -----------------------------------------------------------------------------------

// Two warps, each with its own random A (16 × 16), B (16 × 8) and nonzero C, fragments built
// from the PTX layout above; D gathered by the C/D layout against the float64 product.
template <typename T>
void expect_mma_matches_double_product() {
  constexpr int kWarps = 2;
  std::mt19937 rng(11);
  std::vector<std::vector<uint16_t>> a, b;
  std::vector<std::vector<float>> c;
  std::uniform_real_distribution<float> uc(-3.0f, 3.0f);
  for (int w = 0; w < kWarps; ++w) {
    a.push_back(random_matrix<T>(rng, 16, 16));
    b.push_back(random_matrix<T>(rng, 16, 8));
    std::vector<float> cw(16 * 8);
    for (auto& x : cw) x = uc(rng);
    c.push_back(cw);
  }
  std::vector<float> d_out(kWarps * 32 * 4, std::nanf(""));
  emu::launch(1, 32 * kWarps, 0, [&] {
    const int thread = dev::thread_index();
    const int w = thread / 32, lane = thread % 32;
    uint32_t af[4], bf[2];
    float d[4];
    for (int r = 0; r < 4; ++r) {
      const RowCol lo = a_element(lane, 2 * r), hi = a_element(lane, 2 * r + 1);
      af[r] = pack(a[w][lo.row * 16 + lo.col], a[w][hi.row * 16 + hi.col]);
    }
    for (int r = 0; r < 2; ++r) {
      const RowCol lo = b_element(lane, 2 * r), hi = b_element(lane, 2 * r + 1);
      bf[r] = pack(b[w][lo.row * 8 + lo.col], b[w][hi.row * 8 + hi.col]);
    }
    for (int i = 0; i < 4; ++i) {
      const RowCol e = c_element(lane, i);
      d[i] = c[w][e.row * 8 + e.col];
    }
    dev::mma_m16n8k16<T>(d, af, bf);
    for (int i = 0; i < 4; ++i) d_out[thread * 4 + i] = d[i];
  });
  for (int w = 0; w < kWarps; ++w) {
    std::vector<int> seen(16 * 8, 0);
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) {
        const RowCol e = c_element(lane, i);
        ++seen[e.row * 8 + e.col];
        double expected = c[w][e.row * 8 + e.col], scale = std::abs(expected);
        for (int k = 0; k < 16; ++k) {
          const double p = static_cast<double>(Reference<T>::value(a[w][e.row * 16 + k])) *
                           Reference<T>::value(b[w][k * 8 + e.col]);
          expected += p;
          scale += std::abs(p);
        }
        EXPECT_NEAR(d_out[(w * 32 + lane) * 4 + i], expected, 1e-6 * scale)
            << Reference<T>::name << " warp " << w << " D[" << e.row << "][" << e.col << "]";
      }
    }
    for (int n : seen) ASSERT_EQ(n, 1);  // the C/D layout covers D once
  }
}

TEST(WarpEmulator, MmaHalfMatchesDoubleProduct) { expect_mma_matches_double_product<half>(); }

TEST(WarpEmulator, MmaBfloat16MatchesDoubleProduct) {
  expect_mma_matches_double_product<bfloat16>();
}

TEST(WarpEmulator, MmaPropagatesNaN) {
  // Unlanded cp.async data (0xFFFF) is NaN in both types and must poison the product.
  std::vector<float> out(32 * 4);
  emu::launch(1, 32, 0, [&] {
    const int lane = dev::thread_index();
    const uint32_t one = pack(0x3c00u, 0x3c00u);  // half 1.0, 1.0
    uint32_t af[4] = {one, one, one, one}, bf[2] = {one, one};
    if (lane == 0) af[0] = 0xffffffffu;  // A[0][0], A[0][1] = NaN
    float d[4] = {0, 0, 0, 0};
    dev::mma_m16n8k16<half>(d, af, bf);
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = d[i];
  });
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const RowCol e = c_element(lane, i);
      if (e.row == 0) {
        EXPECT_TRUE(std::isnan(out[lane * 4 + i])) << e.row << "," << e.col;
      } else {
        EXPECT_EQ(out[lane * 4 + i], 16.0f) << e.row << "," << e.col;
      }
    }
  }
}

// ---- ldmatrix ------------------------------------------------------------------------------

// Distinct 16-bit codes: warp, matrix, row, column.
uint16_t code(int w, int m, int r, int c) { return static_cast<uint16_t>((w << 9) | (m << 6) | (r << 3) | c | 0x1000); }

// Row (w, m, r) of 8 values lives at a scattered, padded place: slot s = a permutation of
// 32 w + 8 m + r, at byte (s / 4) · 80 + (s % 4) · 16 (80-byte rows: 4 slots and a 16-byte pad).
size_t row_offset(int w, int m, int r) {
  const int s = (37 * (32 * w + 8 * m + r) + 11) % 64;
  return static_cast<size_t>(s / 4) * 80 + static_cast<size_t>(s % 4) * 16;
}

void expect_ldmatrix_layout(bool trans) {
  constexpr int kWarps = 2;
  constexpr size_t kBytes = 16 * 80;
  std::vector<uint32_t> regs(kWarps * 32 * 4, 0);
  emu::launch(1, 32 * kWarps, kBytes, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    const int thread = dev::thread_index();
    const int w = thread / 32, lane = thread % 32;
    if (thread == 0) {
      std::memset(smem, 0xaa, kBytes);  // padding and unused slots: 0xAAAA
      for (int ww = 0; ww < kWarps; ++ww) {
        for (int m = 0; m < 4; ++m) {
          for (int r = 0; r < 8; ++r) {
            uint16_t row[8];
            for (int c = 0; c < 8; ++c) row[c] = code(ww, m, r, c);
            std::memcpy(smem + row_offset(ww, m, r), row, 16);
          }
        }
      }
    }
    dev::block_sync();
    uint32_t r[4];
    const void* address = smem + row_offset(w, lane / 8, lane % 8);
    if (trans) {
      dev::ldmatrix_x4_trans(r, address);
    } else {
      dev::ldmatrix_x4(r, address);
    }
    for (int k = 0; k < 4; ++k) regs[thread * 4 + k] = r[k];
  });
  for (int w = 0; w < kWarps; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int m = 0; m < 4; ++m) {
        const RowCol lo = ldmatrix_element(lane, 0, trans), hi = ldmatrix_element(lane, 1, trans);
        EXPECT_EQ(regs[(w * 32 + lane) * 4 + m],
                  pack(code(w, m, lo.row, lo.col), code(w, m, hi.row, hi.col)))
            << (trans ? "ldmatrix_x4_trans" : "ldmatrix_x4") << " warp " << w << " lane " << lane
            << " register " << m;
      }
    }
  }
}

TEST(WarpEmulator, LdmatrixX4FollowsThePtxLayout) { expect_ldmatrix_layout(false); }

TEST(WarpEmulator, LdmatrixX4TransFollowsThePtxLayout) { expect_ldmatrix_layout(true); }

// The flash kernel's use: S = Q·Kᵀ and O = P·V for 16 × 16 tiles held row major in shared
// memory (row pitch 24 elements), with the lane addresses it computes:
//   A (Q or P, row major [m][k]):       ldmatrix_x4,       row = lane % 16,
//                                        col = (lane / 16) · 8
//   B = Kᵀ (K row major [n][k]):         ldmatrix_x4,       row = lane % 8 + (lane / 16) · 8,
//                                        col = ((lane / 8) % 2) · 8
//   B = V (V row major [k][n]):          ldmatrix_x4_trans, row = lane % 8 + ((lane / 8) % 2) · 8,
//                                        col = (lane / 16) · 8
// registers 0, 1 of a B load feed the n-tile of columns 0..7, registers 2, 3 columns 8..15.
template <typename T>
void expect_ldmatrix_feeds_mma() {
  constexpr int kPitch = 24;  // elements; 48 bytes, keeps rows 16-byte aligned
  constexpr size_t kTile = 16 * kPitch * 2;
  std::mt19937 rng(23);
  const auto q = random_matrix<T>(rng, 16, 16), k = random_matrix<T>(rng, 16, 16);
  const auto p = random_matrix<T>(rng, 16, 16, 1.0f), v = random_matrix<T>(rng, 16, 16);
  std::vector<float> s_out(32 * 8), o_out(32 * 8);
  emu::launch(1, 32, 4 * kTile, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    auto* sq = reinterpret_cast<uint16_t*>(smem);
    auto* sk = reinterpret_cast<uint16_t*>(smem + kTile);
    auto* sp = reinterpret_cast<uint16_t*>(smem + 2 * kTile);
    auto* sv = reinterpret_cast<uint16_t*>(smem + 3 * kTile);
    const int lane = dev::thread_index();
    if (lane == 0) {
      for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 16; ++c) {
          sq[r * kPitch + c] = q[r * 16 + c];
          sk[r * kPitch + c] = k[r * 16 + c];
          sp[r * kPitch + c] = p[r * 16 + c];
          sv[r * kPitch + c] = v[r * 16 + c];
        }
      }
    }
    dev::block_sync();
    const int a_row = lane % 16, a_col = (lane / 16) * 8;
    uint32_t qa[4], kb[4], pa[4], vb[4];
    dev::ldmatrix_x4(qa, sq + a_row * kPitch + a_col);
    dev::ldmatrix_x4(kb, sk + (lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8);
    float s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
    const uint32_t kb0[2] = {kb[0], kb[1]}, kb1[2] = {kb[2], kb[3]};
    dev::mma_m16n8k16<T>(s0, qa, kb0);
    dev::mma_m16n8k16<T>(s1, qa, kb1);
    dev::ldmatrix_x4(pa, sp + a_row * kPitch + a_col);
    dev::ldmatrix_x4_trans(vb, sv + (lane % 8 + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8);
    float o0[4] = {0, 0, 0, 0}, o1[4] = {0, 0, 0, 0};
    const uint32_t vb0[2] = {vb[0], vb[1]}, vb1[2] = {vb[2], vb[3]};
    dev::mma_m16n8k16<T>(o0, pa, vb0);
    dev::mma_m16n8k16<T>(o1, pa, vb1);
    for (int i = 0; i < 4; ++i) {
      s_out[lane * 8 + i] = s0[i];
      s_out[lane * 8 + 4 + i] = s1[i];
      o_out[lane * 8 + i] = o0[i];
      o_out[lane * 8 + 4 + i] = o1[i];
    }
  });
  auto val = [](uint16_t b) { return static_cast<double>(Reference<T>::value(b)); };
  for (int lane = 0; lane < 32; ++lane) {
    for (int tile = 0; tile < 2; ++tile) {
      for (int i = 0; i < 4; ++i) {
        const RowCol e = c_element(lane, i);
        const int row = e.row, col = e.col + 8 * tile;
        double s = 0, s_scale = 0, o = 0, o_scale = 0;
        for (int d = 0; d < 16; ++d) {
          s += val(q[row * 16 + d]) * val(k[col * 16 + d]);  // (Q Kᵀ)[row][col]
          s_scale += std::abs(val(q[row * 16 + d]) * val(k[col * 16 + d]));
          o += val(p[row * 16 + d]) * val(v[d * 16 + col]);  // (P V)[row][col]
          o_scale += std::abs(val(p[row * 16 + d]) * val(v[d * 16 + col]));
        }
        EXPECT_NEAR(s_out[lane * 8 + tile * 4 + i], s, 1e-6 * s_scale + 1e-30)
            << Reference<T>::name << " S[" << row << "][" << col << "]";
        EXPECT_NEAR(o_out[lane * 8 + tile * 4 + i], o, 1e-6 * o_scale + 1e-30)
            << Reference<T>::name << " O[" << row << "][" << col << "]";
      }
    }
  }
}

TEST(WarpEmulator, LdmatrixFeedsMmaAsTheFlashKernelHalf) { expect_ldmatrix_feeds_mma<half>(); }

TEST(WarpEmulator, LdmatrixFeedsMmaAsTheFlashKernelBfloat16) {
  expect_ldmatrix_feeds_mma<bfloat16>();
}

// ---- shfl, block_sync, scheduling ----------------------------------------------------------

TEST(WarpEmulator, ShflXorReadsTheXoredLaneOfTheSameWarp) {
  const int masks[] = {0, 1, 2, 4, 8, 16, 31, 5};
  std::vector<float> got(64 * 8);
  emu::launch(1, 64, 0, [&] {
    const int thread = dev::thread_index();
    for (int j = 0; j < 8; ++j) got[thread * 8 + j] = dev::shfl_xor(thread * 1.5f + 0.25f, masks[j]);
  });
  for (int thread = 0; thread < 64; ++thread) {
    const int w = thread / 32, lane = thread % 32;
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(got[thread * 8 + j], (w * 32 + (lane ^ masks[j])) * 1.5f + 0.25f)
          << "thread " << thread << " mask " << masks[j];
    }
  }
}

TEST(WarpEmulator, BlockSyncMakesEveryWriteBeforeItVisibleAfterIt) {
  constexpr int kThreads = 256;
  std::vector<int> arrived_seen(kThreads), mismatches(kThreads, 0);
  emu::launch(2, kThreads, kThreads * sizeof(int) + 16, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    auto* values = reinterpret_cast<int*>(smem + 16);
    auto* counter = reinterpret_cast<int*>(smem);
    const int i = dev::thread_index();
    const int b = static_cast<int>(dev::block_index());
    if (i == 0) *counter = 0;
    dev::block_sync();
    ++*counter;  // one emulated thread runs at a time: no race
    values[i] = 1000 * b + i;
    dev::block_sync();
    if (b == 1) arrived_seen[i] = *counter;
    for (int r = 1; r < kThreads; r += 37) {
      if (values[(i + r) % kThreads] != 1000 * b + (i + r) % kThreads) ++mismatches[i];
    }
    const int next = values[(i + 1) % kThreads];
    dev::block_sync();  // every read done before anyone writes again
    values[i] = -next;
    dev::block_sync();
    if (values[i] != -(1000 * b + (i + 1) % kThreads)) ++mismatches[i];
  });
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(arrived_seen[i], kThreads) << "thread " << i << " passed block_sync early";
    EXPECT_EQ(mismatches[i], 0) << "thread " << i;
  }
}

TEST(WarpEmulator, OneThreadRunsAtATimeInTheSameOrderEveryRun) {
  auto run = [](emu::LaunchOptions options) {
    std::atomic<int> running{0};
    int most = 0;
    std::vector<int> order;
    emu::launch(2, 64, 64, [&] {
      auto enter = [&] {
        most = std::max(most, ++running);
        order.push_back(dev::thread_index() + 64 * static_cast<int>(dev::block_index()));
      };
      enter();
      --running;
      const float x = dev::shfl_xor(1.0f, 1);
      enter();
      --running;
      dev::block_sync();
      enter();
      if (dev::thread_index() % 3 == 0) {
        --running;
        dev::shfl_xor(x, 2);  // every lane of the warp: divergent work, then the collective
        ++running;
      } else {
        --running;
        dev::shfl_xor(x, 2);
        ++running;
      }
      --running;
    }, options);
    EXPECT_EQ(most, 1);
    return order;
  };
  const auto first = run({});
  EXPECT_EQ(first.size(), 2u * 64u * 3u);
  EXPECT_EQ(first, run({}));
  const emu::LaunchOptions random{emu::Schedule::kRandom, 9};
  const auto shuffled = run(random);
  EXPECT_EQ(shuffled, run(random));
  EXPECT_NE(shuffled, first);
  EXPECT_EQ(run({emu::Schedule::kHighestFirst, 0})[0], 63);
  // Each thread runs alone until its first collective, in index order; the lane completing a
  // warp collective (the last to arrive) goes on, then the next thread in index order runs.
  for (int i = 0; i < 32; ++i) EXPECT_EQ(first[i], i);
  EXPECT_EQ(first[32], 31);
  EXPECT_EQ(first[33], 32);
}

TEST(WarpEmulator, ShmemStartsAsNaNBytesInEveryBlock) {
  std::vector<int> fresh(3 * 32, 0);
  emu::launch(3, 32, 32, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    const int i = dev::thread_index();
    fresh[dev::block_index() * 32 + i] = smem[i] == 0xff;
    smem[i] = 0;
    EXPECT_EQ(emu::shared_memory_bytes(), 32u);
  });
  for (int n : fresh) EXPECT_EQ(n, 1);
}

// A block sum over several blocks of 256 threads: warp sums by shfl_xor, warp partials through
// shared memory, block_sync, the first warp sums them.
TEST(WarpEmulator, BlockReductionOverSeveralBlocks) {
  constexpr int kBlocks = 5, kThreads = 256, kPerThread = 4;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(kBlocks * kThreads * kPerThread);
  for (auto& e : x) e = u(rng);
  std::vector<float> sums(kBlocks, std::nanf(""));
  std::vector<int> visits(kBlocks * kThreads, 0);
  emu::launch(kBlocks, kThreads, (kThreads / 32) * sizeof(float), [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    auto* partial = reinterpret_cast<float*>(smem);
    const int i = dev::thread_index();
    const int64_t b = dev::block_index();
    ++visits[b * kThreads + i];
    float s = 0.0f;
    for (int j = 0; j < kPerThread; ++j) s += x[(b * kThreads + i) * kPerThread + j];
    for (int mask = 16; mask >= 1; mask /= 2) s += dev::shfl_xor(s, mask);
    if (i % 32 == 0) partial[i / 32] = s;
    dev::block_sync();
    if (i < 32) {
      float t = i < kThreads / 32 ? partial[i] : 0.0f;
      for (int mask = 16; mask >= 1; mask /= 2) t += dev::shfl_xor(t, mask);
      if (i == 0) sums[b] = t;
    }
  });
  for (int n : visits) EXPECT_EQ(n, 1);
  for (int b = 0; b < kBlocks; ++b) {
    double expected = 0;
    for (int j = 0; j < kThreads * kPerThread; ++j) expected += x[b * kThreads * kPerThread + j];
    EXPECT_NEAR(sums[b], expected, 1e-4) << "block " << b;
  }
}

TEST(WarpEmulator, LaunchRejectsBadArguments) {
  auto nothing = [] {};
  EXPECT_THROW(emu::launch(1, 48, 0, nothing), std::invalid_argument);
  EXPECT_THROW(emu::launch(1, 0, 0, nothing), std::invalid_argument);
  EXPECT_THROW(emu::launch(1, 2048, 0, nothing), std::invalid_argument);
  EXPECT_THROW(emu::launch(-1, 32, 0, nothing), std::invalid_argument);
  int runs = 0;
  emu::launch(0, 32, 0, [&] { ++runs; });
  EXPECT_EQ(runs, 0);
  bool nested_threw = false;
  emu::launch(1, 32, 0, [&] {
    if (dev::thread_index() == 0) {
      try {
        emu::launch(1, 32, 0, [] {});
      } catch (const std::invalid_argument&) {
        nested_threw = true;
      }
    }
  });
  EXPECT_TRUE(nested_threw);
}

// ---- cp.async ------------------------------------------------------------------------------

// Global data: 16-byte aligned rows of 8 16-bit codes.
struct alignas(16) Row16 {
  uint16_t v[8];
};

bool is_ff(const unsigned char* p) {
  for (int j = 0; j < 16; ++j)
    if (p[j] != 0xff) return false;
  return true;
}

TEST(WarpEmulator, CpAsyncLandsAtTheWaitAndIsSeenAfterABlockSync) {
  std::vector<Row16> global(32);
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 8; ++j) global[i].v[j] = static_cast<uint16_t>(100 * i + j);
  std::vector<int> before_commit(32), before_wait(32), after_wait(32), neighbour(32);
  emu::launch(1, 32, 32 * 16, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    const int i = dev::thread_index();
    unsigned char* mine = smem + 16 * i;
    std::memset(mine, 0, 16);
    dev::cp_async_16(mine, &global[i], true);
    before_commit[i] = is_ff(mine);
    dev::cp_async_commit();
    if (i == 0) global[0].v[0] = 7;  // the source is read when the copy lands
    before_wait[i] = is_ff(mine);
    dev::cp_async_wait<0>();
    after_wait[i] = std::memcmp(mine, &global[i], 16) == 0;
    dev::block_sync();
    neighbour[i] = std::memcmp(smem + 16 * ((i + 1) % 32), &global[(i + 1) % 32], 16) == 0;
  });
  for (int i = 0; i < 32; ++i) {
    EXPECT_TRUE(before_commit[i]) << i;
    EXPECT_TRUE(before_wait[i]) << i;
    EXPECT_TRUE(after_wait[i]) << i;
    EXPECT_TRUE(neighbour[i]) << i;
  }
}

TEST(WarpEmulator, CpAsyncWaitOneLeavesTheNewestGroupPending) {
  std::vector<Row16> global(3);
  for (int g = 0; g < 3; ++g)
    for (int j = 0; j < 8; ++j) global[g].v[j] = static_cast<uint16_t>(10 * g + j + 1);
  std::vector<int> state;
  emu::launch(1, 32, 3 * 16, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    if (dev::thread_index() != 0) return;
    auto landed = [&](int g) { return std::memcmp(smem + 16 * g, &global[g], 16) == 0; };
    dev::cp_async_16(smem, &global[0], true);
    dev::cp_async_commit();  // group 0
    dev::cp_async_16(smem + 16, &global[1], true);
    dev::cp_async_commit();  // group 1
    dev::cp_async_16(smem + 32, &global[2], true);  // never committed
    dev::cp_async_wait<1>();
    state = {landed(0), is_ff(smem + 16), is_ff(smem + 32)};
    dev::cp_async_wait<1>();  // nothing more to land
    state.push_back(is_ff(smem + 16));
    dev::cp_async_wait<0>();
    state.push_back(landed(1));
    state.push_back(is_ff(smem + 32));  // uncommitted copies never land
    dev::cp_async_commit();             // empty group is fine
    dev::cp_async_wait<0>();
  });
  EXPECT_EQ(state, (std::vector<int>{1, 1, 1, 1, 1, 1}));
}

TEST(WarpEmulator, CpAsyncInvalidZeroFillsWithoutReadingGlobal) {
  std::vector<int> before(32), after(32);
  emu::launch(1, 32, 32 * 16, [&] {
    ATTNLAB_DYNAMIC_SHARED(smem);
    const int i = dev::thread_index();
    // An address that must not be read (null for even lanes, misaligned for odd ones).
    const void* nowhere = i % 2 ? reinterpret_cast<const void*>(uintptr_t{8}) : nullptr;
    dev::cp_async_16(smem + 16 * i, nowhere, false);
    before[i] = is_ff(smem + 16 * i);
    dev::cp_async_commit();
    dev::cp_async_wait<0>();
    bool zero = true;
    for (int j = 0; j < 16; ++j) zero = zero && smem[16 * i + j] == 0;
    after[i] = zero;
  });
  for (int i = 0; i < 32; ++i) {
    EXPECT_TRUE(before[i]) << i;
    EXPECT_TRUE(after[i]) << i;
  }
}

// ---- a pipelined kernel under every schedule -----------------------------------------------

// Four warps sum, over `kTiles` tiles of 64 × 16 float16 values, 16 × 16 blocks through
// ldmatrix_x4 and mma (B = ones), each warp the block of rows that the *next* warp copied; the
// tiles arrive by cp.async into two shared buffers (prefetching tile t + 1 while tile t is
// summed). `bug` removes one step of the pipeline.
enum class PipelineBug { kNone, kNoSyncAfterWait, kNoSyncBeforeOverwrite, kLastWaitKeepsOne };

constexpr int kTiles = 4;

std::vector<float> run_pipeline(const std::vector<Row16>& x, PipelineBug bug,
                                emu::LaunchOptions options) {
  std::vector<float> out(128 * 4, 0.0f);
  emu::launch(
      1, 128, 2 * 2048,
      [&] {
        ATTNLAB_DYNAMIC_SHARED(smem);
        const int i = dev::thread_index(), warp = i / 32, lane = i % 32;
        auto copy_tile = [&](int t) {  // thread i copies 16 bytes: row i / 2, half i % 2
          dev::cp_async_16(smem + (t % 2) * 2048 + i * 16, &x[t * 128 + i], true);
          dev::cp_async_commit();
        };
        const uint32_t ones[2] = {0x3c003c00u, 0x3c003c00u};
        float d[4] = {0, 0, 0, 0};
        copy_tile(0);
        for (int t = 0; t < kTiles; ++t) {
          if (t + 1 < kTiles) {
            copy_tile(t + 1);
            dev::cp_async_wait<1>();
          } else if (bug == PipelineBug::kLastWaitKeepsOne) {
            dev::cp_async_wait<1>();
          } else {
            dev::cp_async_wait<0>();
          }
          if (bug != PipelineBug::kNoSyncAfterWait) dev::block_sync();
          const int rows = 16 * ((warp + 1) % 4);
          uint32_t a[4];
          dev::ldmatrix_x4(a, smem + (t % 2) * 2048 + (rows + lane % 16) * 32 + (lane / 16) * 16);
          dev::mma_m16n8k16<half>(d, a, ones);
          if (bug != PipelineBug::kNoSyncBeforeOverwrite) dev::block_sync();
        }
        for (int j = 0; j < 4; ++j) out[i * 4 + j] = d[j];
      },
      options);
  return out;
}

bool any_nan(const std::vector<float>& v) {
  for (float f : v)
    if (std::isnan(f)) return true;
  return false;
}

TEST(WarpEmulator, PipelinedKernelUnderEverySchedule) {
  std::mt19937 rng(5);
  std::vector<Row16> x(kTiles * 128);
  for (auto& row : x)
    for (auto& v : row.v) v = c10::Half(std::uniform_real_distribution<float>(-1, 1)(rng)).x;
  // Reference: D[m][n] of warp w = Σ_t Σ_k tile_t[16 ((w + 1) % 4) + m][k], in float64.
  std::vector<double> row_sums(64, 0.0);
  for (int t = 0; t < kTiles; ++t)
    for (int r = 0; r < 64; ++r)
      for (int k = 0; k < 16; ++k)
        row_sums[r] += Reference<half>::value(x[t * 128 + r * 2 + k / 8].v[k % 8]);

  using S = emu::Schedule;
  const std::vector<emu::LaunchOptions> schedules = {
      {S::kRoundRobin, 0}, {S::kLowestFirst, 0}, {S::kHighestFirst, 0}, {S::kRandom, 1},
      {S::kRandom, 2}};
  for (const auto& options : schedules) {
    SCOPED_TRACE(testing::Message() << "schedule " << static_cast<int>(options.schedule)
                                    << " seed " << options.seed);
    const auto out = run_pipeline(x, PipelineBug::kNone, options);
    for (int i = 0; i < 128; ++i) {
      const int w = i / 32, lane = i % 32;
      for (int j = 0; j < 4; ++j) {
        const int m = c_element(lane, j).row;
        EXPECT_NEAR(out[i * 4 + j], row_sums[16 * ((w + 1) % 4) + m], 1e-5) << i << "," << j;
      }
    }
    // The last group never waited for: its tile reads as the 0xFF fill, whatever the order.
    EXPECT_TRUE(any_nan(run_pipeline(x, PipelineBug::kLastWaitKeepsOne, options)));
  }
  // No block_sync between a warp's wait and its reading rows that another warp copied.
  for (S s : {S::kRoundRobin, S::kLowestFirst, S::kHighestFirst}) {
    EXPECT_TRUE(any_nan(run_pipeline(x, PipelineBug::kNoSyncAfterWait, {s, 0})))
        << static_cast<int>(s);
  }
  // No block_sync before the prefetch overwrites the buffer other warps still read: found when
  // one warp runs ahead (round robin keeps warps within a collective of each other).
  for (S s : {S::kLowestFirst, S::kHighestFirst}) {
    EXPECT_TRUE(any_nan(run_pipeline(x, PipelineBug::kNoSyncBeforeOverwrite, {s, 0})))
        << static_cast<int>(s);
  }
}

// ---- what must abort -----------------------------------------------------------------------

// Threads are alive inside each statement: run death tests in a fresh process.
class WarpEmulatorDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(WarpEmulatorDeathTest, ThreadReturningWhileOthersWaitAtBlockSync) {
  EXPECT_DEATH(emu::launch(1, 64, 0,
                           [] {
                             if (dev::thread_index() != 40) dev::block_sync();
                           }),
               "deadlock in block 0: thread 40 returned from the kernel while 40 thread\\(s\\) "
               "wait at block_sync");
  EXPECT_DEATH(emu::launch(1, 64, 0,
                           [] {
                             if (dev::thread_index() != 0) dev::block_sync();
                           }),
               "deadlock in block 0: thread 1 arrives at block_sync.*thread 0 has returned");
}

TEST_F(WarpEmulatorDeathTest, LanesOfAWarpAtDifferentCollectives) {
  EXPECT_DEATH(emu::launch(1, 32, 0,
                           [] {
                             if (dev::thread_index() < 16) {
                               dev::shfl_xor(1.0f, 1);
                             } else {
                               float d[4] = {};
                               const uint32_t a[4] = {}, b[2] = {};
                               dev::mma_m16n8k16<half>(d, a, b);
                             }
                           }),
               "divergence in block 0, warp 0: lane 16 \\(thread 16\\) arrives at "
               "mma_m16n8k16<half> while 16 lane\\(s\\) of the warp wait at shfl_xor");
  EXPECT_DEATH(emu::launch(1, 64, 0,
                           [] {
                             if (dev::thread_index() == 33) dev::block_sync();
                             dev::shfl_xor(1.0f, 1);
                           }),
               "divergence in block 0, warp 1");
}

TEST_F(WarpEmulatorDeathTest, LaneReturningWhileItsWarpWaits) {
  EXPECT_DEATH(emu::launch(1, 32, 0,
                           [] {
                             if (dev::thread_index() != 3) dev::shfl_xor(1.0f, 1);
                           }),
               "deadlock in block 0: lane 3 of warp 0 \\(thread 3\\) returned from the kernel "
               "while 3 lane\\(s\\) of its warp wait at shfl_xor");
  EXPECT_DEATH(emu::launch(2, 32, 16,
                           [] {
                             if (dev::block_index() == 1 && dev::thread_index() == 0) return;
                             uint32_t r[4];
                             ATTNLAB_DYNAMIC_SHARED(smem);
                             dev::ldmatrix_x4(r, smem);
                           }),
               "deadlock in block 1: lane 1 of warp 0 \\(thread 1\\) arrives at ldmatrix_x4.*"
               "lane 0 has returned");
}

TEST_F(WarpEmulatorDeathTest, LdmatrixAddressChecks) {
  EXPECT_DEATH(emu::launch(1, 32, 256,
                           [] {
                             ATTNLAB_DYNAMIC_SHARED(smem);
                             uint32_t r[4];
                             dev::ldmatrix_x4(r, smem + 16 * (dev::thread_index() % 8) + 8);
                           }),
               "ldmatrix_x4: thread 0 of block 0 gives shared address .* \\(byte offset 8\\), "
               "not 16-byte aligned");
  EXPECT_DEATH(emu::launch(1, 32, 256,
                           [] {
                             ATTNLAB_DYNAMIC_SHARED(smem);
                             uint32_t r[4];
                             dev::ldmatrix_x4_trans(r, smem + 16 * dev::thread_index());
                           }),
               "ldmatrix_x4_trans: thread 16 of block 0 gives shared address .*, outside the "
               "block's shared buffer");
  alignas(16) static unsigned char host[16];
  EXPECT_DEATH(emu::launch(1, 32, 256,
                           [] {
                             uint32_t r[4];
                             dev::ldmatrix_x4(r, host);
                           }),
               "ldmatrix_x4: thread 0 .* outside the block's shared buffer");
}

TEST_F(WarpEmulatorDeathTest, CpAsyncAddressChecks) {
  alignas(16) static unsigned char global[64];
  EXPECT_DEATH(emu::launch(1, 32, 64,
                           [] {
                             ATTNLAB_DYNAMIC_SHARED(smem);
                             dev::cp_async_16(smem + 4, global, true);
                           }),
               "cp_async_16: thread 0 of block 0 gives shared address .* \\(byte offset 4\\), not "
               "16-byte aligned");
  EXPECT_DEATH(emu::launch(1, 32, 64,
                           [] {
                             ATTNLAB_DYNAMIC_SHARED(smem);
                             dev::cp_async_16(smem + 64, global, true);
                           }),
               "cp_async_16: thread 0 of block 0 gives shared address .*, outside the block's "
               "shared buffer");
  EXPECT_DEATH(emu::launch(1, 32, 64,
                           [] {
                             dev::cp_async_16(global, global + 16, true);  // global as shared
                           }),
               "cp_async_16: .* outside the block's shared buffer");
  EXPECT_DEATH(emu::launch(1, 32, 64,
                           [] {
                             ATTNLAB_DYNAMIC_SHARED(smem);
                             dev::cp_async_16(smem, global + 8, true);
                           }),
               "cp_async_16: thread 0 of block 0 gives global address .*, not 16-byte aligned");
}

TEST_F(WarpEmulatorDeathTest, MisuseOutsideAKernelOrOfShflOrAThrowingKernel) {
  EXPECT_DEATH(dev::thread_index(), "thread_index called outside emulation::launch");
  EXPECT_DEATH(dev::block_sync(), "block_sync called outside emulation::launch");
  EXPECT_DEATH(emu::launch(1, 32, 0, [] { dev::shfl_xor(1.0f, 32); }),
               "shfl_xor: thread 0 of block 0 gives lane_mask 32; expected 0 <= lane_mask < 32");
  EXPECT_DEATH(emu::launch(1, 32, 0,
                           [] {
                             if (dev::thread_index() == 2) throw std::runtime_error("boom");
                           }),
               "thread 2 of block 0: the kernel threw: boom");
}

#if defined(__SANITIZE_ADDRESS__)
// Emulated threads run on fibers whose switches are annotated for AddressSanitizer: it still
// sees an overflow of a kernel's local array, in a thread that runs after other fibers did.
// Out of line, so that only ASan (not UBSan's bounds checks) can tell that p[i] is out of range.
[[gnu::noinline]] float read_element(volatile float* p, int i) { return p[i]; }

TEST_F(WarpEmulatorDeathTest, AddressSanitizerSeesFiberStacks) {
  EXPECT_DEATH(emu::launch(1, 64, 0,
                           [] {
                             volatile float local[8];
                             for (int k = 0; k < 8; ++k) local[k] = static_cast<float>(k);
                             dev::block_sync();
                             volatile int index = dev::thread_index() == 37 ? 8 : 0;
                             const float x = read_element(local, index);
                             dev::block_sync();
                             if (x < 0.0f) std::abort();
                           }),
               "AddressSanitizer: stack-buffer-overflow");
}
#endif

}  // namespace
