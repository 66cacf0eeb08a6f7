#include "parallel/mp/tokens.hpp"

#include <algorithm>

namespace shardcheck::parallel {

TokenLayout::TokenLayout(int64_t seq_len, int cp, int tp, bool sp)
    : seq_len_(seq_len), cp_(cp), tp_(tp), sp_(sp) {
  if (cp < 1 || tp < 1) throw LayoutError("cp and tp must be >= 1");
  if (cp > 1 && seq_len % (2 * int64_t{cp}) != 0) {
    throw LayoutError("seq_len " + std::to_string(seq_len) + " is not divisible by 2*cp = " +
                      std::to_string(2 * cp) + " (causal load balancing cuts 2*cp chunks)");
  }
  if (sp && (seq_len / cp) % tp != 0) {
    throw LayoutError("sequence parallel: " + std::to_string(seq_len / cp) +
                      " rows per CP rank are not divisible by tp = " + std::to_string(tp));
  }
}

std::vector<std::pair<int64_t, int64_t>> TokenLayout::cp_chunks(int cp_rank) const {
  if (cp_ == 1) return {{0, seq_len_}};
  const int64_t chunk = seq_len_ / (2 * int64_t{cp_});
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const int64_t c : {int64_t{cp_rank}, 2 * int64_t{cp_} - 1 - cp_rank})
    out.emplace_back(c * chunk, (c + 1) * chunk);
  return out;
}

std::vector<int64_t> TokenLayout::cp_rows(int cp_rank) const {
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(cp_row_count()));
  for (const auto& [begin, end] : cp_chunks(cp_rank))
    for (int64_t t = begin; t < end; ++t) out.push_back(t);
  return out;
}

std::vector<int64_t> TokenLayout::rows(int cp_rank, int tp_rank) const {
  std::vector<int64_t> all = cp_rows(cp_rank);
  if (!sp_) return all;
  const auto part = all.size() / static_cast<std::size_t>(tp_);
  const auto begin =
      all.begin() + static_cast<std::ptrdiff_t>(part * static_cast<std::size_t>(tp_rank));
  return {begin, begin + static_cast<std::ptrdiff_t>(part)};
}

template <class T>
ref::Tensor<T> take_rows(const ref::Tensor<T>& full, std::span<const int64_t> rows) {
  const int64_t c = full.shape().back();
  ref::Tensor<T> out({static_cast<int64_t>(rows.size()), c});
  if constexpr (!kIsMeta<T>) {
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy_n(full.data() + rows[i] * c, c, out.data() + static_cast<int64_t>(i) * c);
  }
  return out;
}

namespace {
template <class T>
ref::Tensor<T> all_gather_rows(comm::Communicator& g, const ref::Tensor<T>& local) {
  const int64_t c = local.shape().back();
  const int64_t n = local.numel() / c;
  ref::Tensor<T> out({n * g.size(), c});
  if (g.size() == 1) return local;
  g.all_gather(cbuffer_of(local), buffer_of(out))->wait();
  return out;
}
}  // namespace

template <class T>
ref::Tensor<T> sp_gather(comm::Communicator& tp, const ref::Tensor<T>& local) {
  return all_gather_rows(tp, local);
}

template <class T>
ref::Tensor<T> sp_reduce_scatter(comm::Communicator& tp, const ref::Tensor<T>& partial) {
  if (tp.size() == 1) return partial;
  const int64_t c = partial.shape().back();
  const int64_t n = partial.numel() / c / tp.size();
  ref::Tensor<T> out({n, c});
  tp.reduce_scatter(cbuffer_of(partial), buffer_of(out))->wait();
  return out;
}

template <class T>
void all_reduce_sum(comm::Communicator& group, ref::Tensor<T>& t) {
  if (group.size() == 1 || t.numel() == 0) return;
  group.all_reduce(buffer_of(t))->wait();
}

template <class T>
ref::Tensor<T> gather_sequence(const TokenLayout& layout, comm::Communicator& cp,
                               comm::Communicator* tp, const ref::Tensor<T>& local) {
  ref::Tensor<T> cp_local = local;
  if (layout.sp() && layout.tp() > 1) {
    if (tp == nullptr) throw std::logic_error("gather_sequence: SP layout needs the tp group");
    cp_local = sp_gather(*tp, local);
  }
  if (layout.cp() == 1) return cp_local;
  const int64_t c = local.shape().back();
  const ref::Tensor<T> all = all_gather_rows(cp, cp_local);
  ref::Tensor<T> full({layout.seq_len(), c});
  if constexpr (!kIsMeta<T>) {
    const int64_t per = layout.cp_row_count();
    for (int r = 0; r < layout.cp(); ++r) {
      const std::vector<int64_t> rows = layout.cp_rows(r);
      for (int64_t i = 0; i < per; ++i) {
        std::copy_n(all.data() + (r * per + i) * c, c,
                    full.data() + rows[static_cast<std::size_t>(i)] * c);
      }
    }
  }
  return full;
}

#define SHARDCHECK_TOKENS(T)                                                             \
  template ref::Tensor<T> take_rows(const ref::Tensor<T>&, std::span<const int64_t>);    \
  template ref::Tensor<T> gather_sequence(const TokenLayout&, comm::Communicator&,       \
                                          comm::Communicator*, const ref::Tensor<T>&);   \
  template ref::Tensor<T> sp_gather(comm::Communicator&, const ref::Tensor<T>&);         \
  template ref::Tensor<T> sp_reduce_scatter(comm::Communicator&, const ref::Tensor<T>&); \
  template void all_reduce_sum(comm::Communicator&, ref::Tensor<T>&);
SHARDCHECK_TOKENS(double)
SHARDCHECK_TOKENS(float)
SHARDCHECK_TOKENS(Meta<double>)
SHARDCHECK_TOKENS(Meta<float>)
#undef SHARDCHECK_TOKENS

}  // namespace shardcheck::parallel
