// The element-wise programs (kernels/elementwise.h) the optimizers are made of, shared where
// two kinds take the same step (lars takes momentum's, lamb Adam's moments). Each reproduces the
// arithmetic of the textbook update in its order of operations (without weight decay ĝ is g,
// and no pass computes it):
//   sgd       w' = w − lr (g + wd w)
//   momentum  v = μ v + (g + wd w);  w' = w − lr v   (Nesterov: w' = w − lr ((g + wd w) + μ v))
//   adam      m = β1 m + (1 − β1) ĝ;  v = β2 v + (1 − β2) ĝ ĝ;  w' = w − lr (m / bc1) / (√(v / bc2) + ε),
//             ĝ = g + wd w, bc_i = 1 − β_i^step
// The per-step scalars (lr, the bias corrections) are math::Scalars: fixed, or live in a step
// graph (OptimizerStep::live).
#pragma once

#include <cmath>

#include "elementwise.h"

namespace pslab::optimizers {

using math::OpCode;
using math::Program;
using math::Scalar;

// ĝ = g + wd w into register `into`, or without weight decay g itself (register 1, no pass):
// the register that holds ĝ. Arrays 0 and 1 are w and g.
inline int decayed_gradient(Program& p, float wd, int into) {
  if (wd == 0.0f) return 1;
  p.op(OpCode::axpby, into, 1, 0, 1.0f, wd);
  return into;
}

// Arrays: w, g, w_out. Temporaries from 3. neg_lr: −lr.
inline Program sgd_program(Scalar neg_lr, float wd) {
  Program p;
  p.arrays = 3;
  const int gd = decayed_gradient(p, wd, 3);
  p.op(OpCode::axpby, 2, 0, gd, 1.0f, neg_lr);  // w_out = w − lr ĝ
  return p;
}

// Arrays: w, g, w_out, v. Temporaries from 4. neg_lr: −lr.
inline Program momentum_program(Scalar neg_lr, float mu, float wd, bool nesterov) {
  Program p;
  p.arrays = 4;
  const int gd = decayed_gradient(p, wd, 4);
  p.op(OpCode::axpby, 3, 3, gd, mu, 1.0f);  // v = μ v + ĝ
  if (nesterov) p.op(OpCode::axpby, 5, gd, 3, 1.0f, mu);  // ĝ + μ v
  p.op(OpCode::axpby, 2, 0, nesterov ? 5 : 3, 1.0f, neg_lr);
  return p;
}

inline float bias_correction(double beta, long step) { return 1.0f - std::pow(float(beta), float(step)); }

// Adam's moments from ĝ = g + wd w, and its direction d = lr (m / bc1) / (√(v / bc2) + ε) into
// register 7. Arrays: w, g, (w_out), m, v. Temporaries: 5, 6, 7.
inline void adam_direction(Program& p, Scalar lr, float beta1, float beta2, float eps, float wd, Scalar bc1, Scalar bc2) {
  const int gd = decayed_gradient(p, wd, 5);
  p.op(OpCode::axpby, 3, 3, gd, beta1, 1.0f - beta1);       // m = β1 m + (1 − β1) ĝ
  p.op(OpCode::scale, 6, gd, 0, 1.0f - beta2);               // (1 − β2) ĝ
  p.op(OpCode::mul, 6, 6, gd);                               // (1 − β2) ĝ ĝ
  p.op(OpCode::axpby, 4, 4, 6, beta2, 1.0f);                // v = β2 v + (1 − β2) ĝ ĝ
  p.op(OpCode::div_scalar, 6, 4, 0, bc2);                    // v̂
  p.op(OpCode::sqrt, 6, 6);
  p.op(OpCode::add_scalar, 6, 6, 0, eps);                    // √v̂ + ε
  p.op(OpCode::div_scalar, 7, 3, 0, bc1);                    // m̂
  p.op(OpCode::scale, 7, 7, 0, lr);
  p.op(OpCode::div, 7, 7, 6);                                // lr m̂ / (√v̂ + ε)
}

}  // namespace pslab::optimizers
