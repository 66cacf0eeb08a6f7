// Which rows (token positions) of a sequence a rank holds under context parallelism (CP) and
// sequence parallelism (SP), and moving rows between ranks. Shared by the model-parallel pieces
// (cp_attention, ep_moe, the TP block, the mesh engine). The row movers also take Meta tensors
// (meta.hpp): the same collectives on null buffers.
//
// CP with causal load balancing (Megatron-Core / ring-flash-attention "zigzag"): the sequence of
// length S is cut into 2*cp chunks of S/(2*cp) rows; CP rank r holds chunk r and chunk 2*cp-1-r,
// in that order, so every rank gets the same share of the causal triangle. With cp == 1 a rank
// holds all S rows in order. SP then splits a CP rank's rows into tp equal contiguous parts (tp
// rank t holds part t); without SP every TP rank holds all of the CP rank's rows.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/meta.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// A partition the shapes do not allow (S not divisible by 2*cp, rows not divisible by tp).
class LayoutError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class TokenLayout {
 public:
  // Throws LayoutError naming the sizes when seq_len does not divide: cp > 1 needs
  // seq_len % (2*cp) == 0; sp needs the CP rank's rows divisible by tp.
  TokenLayout(int64_t seq_len, int cp, int tp, bool sp);

  int64_t seq_len() const { return seq_len_; }
  int cp() const { return cp_; }
  int tp() const { return tp_; }
  bool sp() const { return sp_; }

  // The [begin, end) runs of global rows CP rank `cp_rank` holds, in local order: its two chunks
  // (cp == 1: the whole sequence).
  std::vector<std::pair<int64_t, int64_t>> cp_chunks(int cp_rank) const;
  // Global rows held by CP rank `cp_rank` (before SP), in local order: its chunks' rows.
  std::vector<int64_t> cp_rows(int cp_rank) const;
  // Global rows held by (cp_rank, tp_rank) after SP (== cp_rows(cp_rank) without SP).
  std::vector<int64_t> rows(int cp_rank, int tp_rank) const;
  int64_t cp_row_count() const { return seq_len_ / cp_; }
  int64_t row_count() const { return sp_ ? seq_len_ / cp_ / tp_ : seq_len_ / cp_; }

 private:
  int64_t seq_len_;
  int cp_, tp_;
  bool sp_;
};

// Rows `rows` of a full [S, c] tensor, in the order given.
template <class T>
ref::Tensor<T> take_rows(const ref::Tensor<T>& full, std::span<const int64_t> rows);

// The full [S, c] tensor from every rank's local rows. local is [layout.rows(cp rank, tp rank), c]
// on every member of `cp` (and of `tp` when layout.sp()); tp may be null without SP. Collective
// over tp (SP only: all_gather) then cp (all_gather); every caller gets the same tensor.
template <class T>
ref::Tensor<T> gather_sequence(const TokenLayout& layout, comm::Communicator& cp,
                               comm::Communicator* tp, const ref::Tensor<T>& local);

// SP: all_gather of the TP group's row parts into the CP rank's rows [cp_row_count, c] (tp-rank
// order is row order). Collective over tp.
template <class T>
ref::Tensor<T> sp_gather(comm::Communicator& tp, const ref::Tensor<T>& local);
// SP: reduce_scatter (sum) of [cp_row_count, c] partial sums over tp; returns this TP rank's
// [cp_row_count / tp, c] part. Collective over tp.
template <class T>
ref::Tensor<T> sp_reduce_scatter(comm::Communicator& tp, const ref::Tensor<T>& partial);
// In-place sum all_reduce of a tensor over a group (a no-op when the group has one member).
template <class T>
void all_reduce_sum(comm::Communicator& group, ref::Tensor<T>& t);

}  // namespace shardcheck::parallel
