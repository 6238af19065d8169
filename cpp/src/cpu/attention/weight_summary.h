#pragma once
// Summaries of the attention weights reduced inside the forward, block of query rows by block,
// instead of writing the [batch, len_q, len_k] weights out: memory O(len·k) beside the
// output, whatever the length.

#include <cstdint>
#include <vector>

#include "cpu/attention/sparse_rows.h"

namespace attnlab::cpu {

// Which summaries attention_forward reduces and where they go, each contiguous at the
// problem's batch (a null pointer: not asked for). T is the kernel's type.
template <typename T>
struct WeightSummaries {
  T* received = nullptr;         // [batch, len_k]: Σ_i P_ij, the attention each key receives
  T* entropy = nullptr;          // [batch, len_q]: −Σ_j P_ij·log P_ij in nats, 0·log 0 = 0
  int64_t topk = 0;              // k > 0: the k largest weights of each query, descending,
  T* topk_weights = nullptr;     //   [batch, len_q, k], and their keys [batch, len_q, k]
  int64_t* topk_indices = nullptr;  //   (ties: the lower key first)
  int64_t pool = 0;              // > 0: [batch, ⌈len_q/pool⌉, ⌈len_k/pool⌉], each block's sum
  T* pooled = nullptr;           //   of weights (the caller divides by the block's cells)
  const int64_t* to = nullptr;   // n_to keys in [0, len_k): P at those keys,
  int64_t n_to = 0;              //   [batch, len_q, n_to]
  T* to_weights = nullptr;
};

// One thread's sums over the rows it reduced (received and pooled, which rows of several
// tasks add to), added into the outputs once its tasks are done (summary_partials_add).
template <typename T>
struct SummaryPartials {
  std::vector<T> received, pooled;
  std::vector<T> scratch;  // the top-k's group maxima
  std::vector<T> columns;  // column sums of the rows of one pool block (summarize_rows)
  std::vector<T> row;      // one row made dense (summarize_lists' rows without values)
  std::vector<int32_t> to_slot;  // per key: its first position in s.to, or −1
};

template <typename T>
SummaryPartials<T> summary_partials(const WeightSummaries<T>& s, int64_t batch, int64_t len_q,
                                    int64_t len_k);

// Reduces rows [i0, i0 + rows) of batch entry b, whose normalized weights are w (rows of
// len_k, ld apart; zeros at masked and hidden keys), into s and partials. entropies
// (nullable): the rows' entropies where the caller has them already.
template <typename T>
void summarize_rows(const WeightSummaries<T>& s, int64_t len_q, int64_t len_k, int64_t b,
                    int64_t i0, int64_t rows, const T* w, int64_t ld,
                    SummaryPartials<T>& partials, const T* entropies = nullptr);

// The same for rows whose weights are a sparse normalizer's support lists (sparse_rows.h) for
// rows [0, rows) of the lists: O(support) per row instead of O(len_k). A row without values
// (empty or NaN) is made dense and reduced as by summarize_rows.
template <typename T>
void summarize_lists(const WeightSummaries<T>& s, int64_t len_q, int64_t len_k, int64_t b,
                     int64_t i0, int64_t rows, const SupportLists<T>& lists,
                     SummaryPartials<T>& partials);

// Adds partials into s's received and pooled (serialised by the caller).
template <typename T>
void summary_partials_add(const WeightSummaries<T>& s, const SummaryPartials<T>& partials);

}  // namespace attnlab::cpu
