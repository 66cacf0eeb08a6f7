// Internal to gpu/ops: the column-major (cuBLAS) GEMM calls behind the row-major linear ops, as
// data. A row-major X[r,c] is the column-major X^T with leading dimension c, so each row-major
// formula is computed as its transpose. ops.cu (f32/f64) and bf16.cu (tensor cores) issue these
// plans; tests/gpu/gemm_plan_host_test.cpp runs them through a host emulation of cuBLAS's
// column-major GEMM against the reference ops, so the mapping is checked without a GPU.
#pragma once

#include <array>
#include <cstdint>

namespace shardcheck::gpu::detail {

// The operands of the linear ops (forward: x, w -> y; backward: dy, x, w -> dx, dw).
enum class Operand { x, w, y, dy, dx, dw };

// C[m,n] = op(A) op(B) (+ C when accumulate), all column-major; op(X) = X^T when trans.
struct GemmPlan {
  bool trans_a, trans_b;
  int64_t m, n, k;
  Operand a;
  int64_t lda;
  Operand b;
  int64_t ldb;
  bool accumulate;  // beta = 1 (dw +=), else beta = 0 (overwrite)
  Operand c;
  int64_t ldc;
};

// y[rows,out] = x[rows,in] . w[in,out]:  y^T[out,rows] = w^T[out,in] . x^T[in,rows]
inline GemmPlan linear_forward_plan(int64_t rows, int64_t in, int64_t out) {
  return {false, false, out, rows, in, Operand::w, out, Operand::x, in, false, Operand::y, out};
}

// dx[rows,in] = dy . w^T:  dx^T[in,rows] = w[in,out] (w^T stored, transposed) . dy^T[out,rows]
// dw[in,out] += x^T . dy:  dw^T[out,in] += dy^T[out,rows] . x[rows,in] (x^T stored, transposed)
inline std::array<GemmPlan, 2> linear_backward_plans(int64_t rows, int64_t in, int64_t out) {
  return {{{true, false, in, rows, out, Operand::w, out, Operand::dy, out, false, Operand::dx, in},
           {false, true, out, in, rows, Operand::dy, out, Operand::x, in, true, Operand::dw, out}}};
}

// y[rows,out] = x[rows,in] . w^T, w [out,in]:  y^T[out,rows] = w[out,in] (transposed) . x^T
inline GemmPlan linear_t_forward_plan(int64_t rows, int64_t in, int64_t out) {
  return {true, false, out, rows, in, Operand::w, in, Operand::x, in, false, Operand::y, out};
}

// dx[rows,in] = dy . w:  dx^T[in,rows] = w^T[in,out] . dy^T[out,rows]
// dw[out,in] += dy^T . x:  dw^T[in,out] += x^T[in,rows] . dy[rows,out] (dy^T stored, transposed)
inline std::array<GemmPlan, 2> linear_t_backward_plans(int64_t rows, int64_t in, int64_t out) {
  return {{{false, false, in, rows, out, Operand::w, in, Operand::dy, out, false, Operand::dx, in},
           {false, true, in, out, rows, Operand::x, in, Operand::dy, out, true, Operand::dw, in}}};
}

// The pointers of one linear op, looked up by Operand.
template <class In, class Out>
struct GemmOperands {
  const In* x = nullptr;
  const In* w = nullptr;
  const In* dy = nullptr;
  Out* y = nullptr;
  Out* dx = nullptr;
  Out* dw = nullptr;
  const In* in(Operand o) const {
    return o == Operand::x ? x : o == Operand::w ? w : o == Operand::dy ? dy : nullptr;
  }
  Out* out(Operand o) const {
    return o == Operand::y ? y : o == Operand::dx ? dx : o == Operand::dw ? dw : nullptr;
  }
};

}  // namespace shardcheck::gpu::detail
