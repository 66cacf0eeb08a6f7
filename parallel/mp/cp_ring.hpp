// Internal to cp_attention: the ring algorithm (cp_ring.cpp). The caller has validated the shapes
// and filled the cache's shape, dropout, seq_len, head_dim and chunks (a numeric run's also rows
// and doc_ids).
#pragma once

#include "parallel/mp/cp_attention.hpp"

namespace shardcheck::parallel::detail {

template <class T>
ref::Tensor<T> ring_attention_forward(comm::Communicator& cp, const ref::Tensor<T>& q,
                                      const ref::Tensor<T>& k, const ref::Tensor<T>& v,
                                      CpAttentionCache<T>& cache);

template <class T>
void ring_attention_backward(comm::Communicator& cp, const ref::Tensor<T>& dout,
                             const CpAttentionCache<T>& cache, ref::Tensor<T>& dq,
                             ref::Tensor<T>& dk, ref::Tensor<T>& dv);

}  // namespace shardcheck::parallel::detail
