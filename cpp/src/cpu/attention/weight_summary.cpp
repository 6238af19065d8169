#include "cpu/attention/weight_summary.h"

// 64-byte vectors as arguments of the inlined helpers (vec_lanes.h): GCC notes the ABI change.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/isa/isa.h"
#include "cpu/isa/vec_lanes.h"

namespace attnlab::cpu {
namespace {

int64_t blocks_of(int64_t length, int64_t pool) { return (length + pool - 1) / pool; }

// The lane-wise larger of two vectors (reduce_lanes' operation for a maximum).
template <typename T>
ATTNLAB_INLINE Vec<T> larger(Vec<T> a, Vec<T> b) {
  return a > b ? a : b;
}

// The largest of x[0, n), NaN skipped (−inf for none). A loop the compiler vectorizes for each
// instruction set: on the 64-byte vectors (vec_lanes.h) an AVX2 clone took a maximum across
// lanes through memory, lane by lane.
template <typename T>
ATTNLAB_INLINE T largest_of(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < n; ++c) m = x[c] > m ? x[c] : m;
  return m;
}

// −Σ p·log p over one row: the zeros of masked keys (and of a sparse map) add exactly 0 (the
// log's argument is kept normal, and p = 0 multiplies it). On whole vectors (vec_lanes.h): as
// a loop of scalar logs GCC left it scalar, 4× the forward's own time at (1, 1, 4096, 64).
template <typename T>
ATTNLAB_INLINE T row_entropy(const T* w, int64_t n) {
  constexpr int64_t kStep = kLanes<T>;
  const Vec<T> tiny = Vec<T>{} + std::numeric_limits<T>::min();
  Vec<T> sums = {};
  for (int64_t j = 0; j < n; j += kStep) {
    const Vec<T> p = load_part(w + j, std::min(kStep, n - j));
    // (a sparse map's rows are mostly zeros: no logs for their vectors)
    if (!(reduce_lanes<T>(p, larger<T>) > T(0))) continue;
    sums += p * log_positive_vec(p > tiny ? p : tiny);
  }
  const T sum = reduce_lanes<T>(sums, [](Vec<T> a, Vec<T> b) { return a + b; });
  return sum == T(0) ? T(0) : -sum;
}

// The k largest entries of one row, descending, ties to the lower index. Where the row has at
// least k groups of whole vectors, the k-th largest of the groups' maxima bounds the k-th
// largest entry from below (those maxima are k distinct entries): only groups whose maximum
// reaches it, and in them only vectors that reach it, are looked at entry by entry. Inserting
// entries one by one as the scan met them (mispredicted, and most of a row's chunks hit early
// on) was the whole of top-8's cost, 0.27× the forward's own time at (1, 1, 4096, 64). A group
// is the most vectors (up to 4) that still leave 4k groups, so that the bound stays tight on
// short rows. scratch: room for 2·(n / lanes) entries.
template <typename T>
ATTNLAB_INLINE void row_topk(const T* w, int64_t n, int64_t k, T* values, int64_t* indices,
                             T* scratch) {
  int64_t held = 0;
  const auto insert = [&](T x, int64_t j) {
    int64_t pos = held < k ? held++ : k - 1;
    while (pos > 0 && values[pos - 1] < x) {
      values[pos] = values[pos - 1];
      indices[pos] = indices[pos - 1];
      --pos;
    }
    values[pos] = x;
    indices[pos] = j;
  };
  constexpr int64_t kLanesT = kLanes<T>;
  int64_t per_group = 4;
  while (per_group > 1 && n / (per_group * kLanesT) < 4 * k) per_group /= 2;
  const int64_t group = per_group * kLanesT, groups = n / group;
  const bool bounded = groups >= k;
  T bound = -std::numeric_limits<T>::infinity();
  T* maxima = scratch;
  if (bounded) {
    // The k largest maxima, descending, by insertion as they are made: std::nth_element on a
    // copy of the 32–64 maxima was a third of the top-k's time at (1, 1, 1024, 64).
    T* order = scratch + groups;
    int64_t ranked = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const T m = largest_of(w + g * group, group);
      maxima[g] = m;
      if (ranked == k && !(m > order[k - 1])) continue;
      int64_t pos = ranked < k ? ranked++ : k - 1;
      for (; pos > 0 && order[pos - 1] < m; --pos) order[pos] = order[pos - 1];
      order[pos] = m;
    }
    bound = order[k - 1];
  }
  // An entry is a candidate from the bound on, and once k are held only above the k-th.
  const auto consider = [&](int64_t c) {
    if (held < k ? w[c] >= bound : w[c] > values[k - 1]) insert(w[c], c);
  };
  int64_t j = 0;
  for (int64_t g = 0; bounded && g < groups; ++g, j += group) {
    if (maxima[g] < bound) continue;
    for (int64_t q = 0; q < per_group; ++q) {
      const T* x = w + j + q * kLanesT;
      const T floor = held < k ? bound : std::max(bound, values[k - 1]);
      if (per_group > 1 && largest_of(x, kLanesT) < floor) continue;
      for (int64_t c = j + q * kLanesT; c < j + (q + 1) * kLanesT; ++c) consider(c);
    }
  }
  for (; j < n; ++j) consider(j);
}

template <typename T>
ATTNLAB_INLINE void summarize_impl(const WeightSummaries<T>& s, int64_t len_q, int64_t len_k,
                                   int64_t b, int64_t i0, int64_t rows, const T* w, int64_t ld,
                                   T* received, T* pooled, const T* entropies, T* scratch,
                                   T* columns) {
  const int64_t pooled_k = s.pool > 0 ? blocks_of(len_k, s.pool) : 0;
  // received and pooled both sum columns: the rows of one pool block are added into columns
  // (one pass per row), then columns into both once per pool block of rows, instead of two
  // passes per row with a sum across lanes for every pool block.
  const bool sums = received != nullptr || pooled != nullptr;
  const auto add_columns = [&](int64_t pool_row) {
    if (received != nullptr) {
      T* acc = received + b * len_k;
#pragma omp simd
      for (int64_t j = 0; j < len_k; ++j) acc[j] += columns[j];
    }
    if (pooled != nullptr) {
      T* acc = pooled + (b * blocks_of(len_q, s.pool) + pool_row) * pooled_k;
      for (int64_t c = 0; c < pooled_k; ++c) {
        const int64_t end = std::min(len_k, (c + 1) * s.pool);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = c * s.pool; j < end; ++j) sum += columns[j];
        acc[c] += sum;
      }
    }
    std::fill(columns, columns + len_k, T(0));
  };
  int64_t pool_row = pooled != nullptr ? i0 / s.pool : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = w + r * ld;
    const int64_t i = b * len_q + i0 + r;
    if (s.entropy != nullptr) s.entropy[i] = entropies ? entropies[r] : row_entropy(row, len_k);
    if (s.topk > 0) row_topk(row, len_k, s.topk, s.topk_weights + i * s.topk,
                             s.topk_indices + i * s.topk, scratch);
    for (int64_t t = 0; t < s.n_to; ++t) s.to_weights[i * s.n_to + t] = row[s.to[t]];
    if (!sums) continue;
    if (pooled != nullptr && (i0 + r) / s.pool != pool_row) {
      add_columns(pool_row);
      pool_row = (i0 + r) / s.pool;
    }
#pragma omp simd
    for (int64_t j = 0; j < len_k; ++j) columns[j] += row[j];
  }
  if (sums && rows > 0) add_columns(pool_row);
}

// summarize_impl's reductions of rows given as support lists: each row's list holds its
// non-zero weights (dropped keys may sit in it as zeros), in any key order.
template <typename T>
ATTNLAB_INLINE void summarize_lists_impl(const WeightSummaries<T>& s, int64_t len_q,
                                         int64_t len_k, int64_t b, int64_t i0, int64_t rows,
                                         const SupportLists<T>& lists, T* received, T* pooled,
                                         const int32_t* to_slot) {
  const int64_t pooled_k = s.pool > 0 ? blocks_of(len_k, s.pool) : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = b * len_q + i0 + r, begin = lists.start[r], n = lists.count[r];
    const int32_t* keys = lists.index + begin;
    const T* w = lists.p + begin;
    if (s.entropy != nullptr) s.entropy[i] = row_entropy(w, n);
    if (s.topk > 0) {
      // The k largest positive entries, descending, ties to the lower key; fewer than k: the
      // zeros follow at the lowest keys not among them, as in a dense row.
      T* values = s.topk_weights + i * s.topk;
      int64_t* indices = s.topk_indices + i * s.topk;
      int64_t held = 0;
      for (int64_t e = 0; e < n; ++e) {
        const T x = w[e];
        const int64_t j = keys[e];
        const auto ahead = [&](int64_t pos) {
          return x > values[pos] || (x == values[pos] && j < indices[pos]);
        };
        if (!(x > T(0)) || (held == s.topk && !ahead(s.topk - 1))) continue;
        int64_t pos = held < s.topk ? held++ : s.topk - 1;
        while (pos > 0 && ahead(pos - 1)) {
          values[pos] = values[pos - 1];
          indices[pos] = indices[pos - 1];
          --pos;
        }
        values[pos] = x;
        indices[pos] = j;
      }
      for (int64_t j = 0; held < s.topk; ++j) {
        if (std::find(indices, indices + held, j) != indices + held) continue;
        values[held] = T(0);
        indices[held++] = j;
      }
    }
    if (s.n_to > 0) {
      T* to = s.to_weights + i * s.n_to;
      std::fill(to, to + s.n_to, T(0));
      for (int64_t e = 0; e < n; ++e) {
        if (to_slot[keys[e]] >= 0) to[to_slot[keys[e]]] = w[e];
      }
      for (int64_t t = 0; t < s.n_to; ++t) to[t] = to[to_slot[s.to[t]]];
    }
    if (received != nullptr) {
      T* acc = received + b * len_k;
      for (int64_t e = 0; e < n; ++e) acc[keys[e]] += w[e];
    }
    if (pooled != nullptr) {
      T* acc = pooled + ((b * blocks_of(len_q, s.pool)) + (i0 + r) / s.pool) * pooled_k;
      for (int64_t e = 0; e < n; ++e) acc[keys[e] / s.pool] += w[e];
    }
  }
}

// The row loops per instruction set (isa.h).
ATTNLAB_ISA_CLONES void summarize_block(const WeightSummaries<float>& s, int64_t len_q,
                                        int64_t len_k, int64_t b, int64_t i0, int64_t rows,
                                        const float* w, int64_t ld, float* received,
                                        float* pooled, const float* entropies, float* scratch,
                                        float* columns) {
  summarize_impl(s, len_q, len_k, b, i0, rows, w, ld, received, pooled, entropies, scratch,
                 columns);
}

ATTNLAB_ISA_CLONES void summarize_block(const WeightSummaries<double>& s, int64_t len_q,
                                        int64_t len_k, int64_t b, int64_t i0, int64_t rows,
                                        const double* w, int64_t ld, double* received,
                                        double* pooled, const double* entropies,
                                        double* scratch, double* columns) {
  summarize_impl(s, len_q, len_k, b, i0, rows, w, ld, received, pooled, entropies, scratch,
                 columns);
}

ATTNLAB_ISA_CLONES void summarize_list_block(const WeightSummaries<float>& s, int64_t len_q,
                                             int64_t len_k, int64_t b, int64_t i0, int64_t rows,
                                             const SupportLists<float>& lists, float* received,
                                             float* pooled, const int32_t* to_slot) {
  summarize_lists_impl(s, len_q, len_k, b, i0, rows, lists, received, pooled, to_slot);
}

ATTNLAB_ISA_CLONES void summarize_list_block(const WeightSummaries<double>& s, int64_t len_q,
                                             int64_t len_k, int64_t b, int64_t i0, int64_t rows,
                                             const SupportLists<double>& lists,
                                             double* received, double* pooled,
                                             const int32_t* to_slot) {
  summarize_lists_impl(s, len_q, len_k, b, i0, rows, lists, received, pooled, to_slot);
}

}  // namespace

template <typename T>
SummaryPartials<T> summary_partials(const WeightSummaries<T>& s, int64_t batch, int64_t len_q,
                                    int64_t len_k) {
  SummaryPartials<T> partials;
  if (s.received != nullptr) partials.received.assign(batch * len_k, T(0));
  if (s.received != nullptr || s.pool > 0) partials.columns.assign(len_k, T(0));
  partials.scratch.resize(2 * (len_k / kLanes<T>) + 1);
  if (s.pool > 0) {
    partials.pooled.assign(batch * blocks_of(len_q, s.pool) * blocks_of(len_k, s.pool), T(0));
  }
  return partials;
}

template <typename T>
void summarize_rows(const WeightSummaries<T>& s, int64_t len_q, int64_t len_k, int64_t b,
                    int64_t i0, int64_t rows, const T* w, int64_t ld,
                    SummaryPartials<T>& partials, const T* entropies) {
  summarize_block(s, len_q, len_k, b, i0, rows, w, ld,
                  partials.received.empty() ? nullptr : partials.received.data(),
                  partials.pooled.empty() ? nullptr : partials.pooled.data(), entropies,
                  partials.scratch.data(), partials.columns.data());
}

template <typename T>
void summarize_lists(const WeightSummaries<T>& s, int64_t len_q, int64_t len_k, int64_t b,
                     int64_t i0, int64_t rows, const SupportLists<T>& lists,
                     SummaryPartials<T>& partials) {
  if (s.n_to > 0 && partials.to_slot.empty()) {
    partials.to_slot.assign(len_k, -1);
    for (int64_t t = s.n_to - 1; t >= 0; --t) partials.to_slot[s.to[t]] = static_cast<int32_t>(t);
  }
  T* received = partials.received.empty() ? nullptr : partials.received.data();
  T* pooled = partials.pooled.empty() ? nullptr : partials.pooled.data();
  // Runs of rows with values go as lists, the others one by one as dense rows.
  for (int64_t r0 = 0; r0 < rows;) {
    const SupportLists<T> from{lists.index, lists.p, lists.s, lists.start + r0,
                               lists.count + r0, lists.state + r0};
    if (lists.state[r0] != kRowValues) {
      partials.row.resize(len_k);
      sparse_dense_rows(from, 1, len_k, partials.row.data(), len_k, false);
      summarize_block(s, len_q, len_k, b, i0 + r0, 1, partials.row.data(), len_k, received,
                      pooled, static_cast<const T*>(nullptr), partials.scratch.data(),
                      partials.columns.data());
      ++r0;
      continue;
    }
    int64_t r1 = r0 + 1;
    while (r1 < rows && lists.state[r1] == kRowValues) ++r1;
    summarize_list_block(s, len_q, len_k, b, i0 + r0, r1 - r0, from, received, pooled,
                         partials.to_slot.data());
    r0 = r1;
  }
}

template <typename T>
void summary_partials_add(const WeightSummaries<T>& s, const SummaryPartials<T>& partials) {
  for (size_t j = 0; j < partials.received.size(); ++j) s.received[j] += partials.received[j];
  for (size_t j = 0; j < partials.pooled.size(); ++j) s.pooled[j] += partials.pooled[j];
}

template SummaryPartials<float> summary_partials(const WeightSummaries<float>&, int64_t,
                                                 int64_t, int64_t);
template SummaryPartials<double> summary_partials(const WeightSummaries<double>&, int64_t,
                                                  int64_t, int64_t);
template void summarize_rows(const WeightSummaries<float>&, int64_t, int64_t, int64_t, int64_t,
                             int64_t, const float*, int64_t, SummaryPartials<float>&,
                             const float*);
template void summarize_rows(const WeightSummaries<double>&, int64_t, int64_t, int64_t,
                             int64_t, int64_t, const double*, int64_t, SummaryPartials<double>&,
                             const double*);
template void summarize_lists(const WeightSummaries<float>&, int64_t, int64_t, int64_t,
                              int64_t, int64_t, const SupportLists<float>&,
                              SummaryPartials<float>&);
template void summarize_lists(const WeightSummaries<double>&, int64_t, int64_t, int64_t,
                              int64_t, int64_t, const SupportLists<double>&,
                              SummaryPartials<double>&);
template void summary_partials_add(const WeightSummaries<float>&, const SummaryPartials<float>&);
template void summary_partials_add(const WeightSummaries<double>&,
                                   const SummaryPartials<double>&);

}  // namespace attnlab::cpu
