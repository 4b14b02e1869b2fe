#include "onednn_conv.h"

#include <omp.h>

#include <cstring>
#include <dnnl.hpp>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace pslab {

namespace {
using dnnl::memory;
using tag = memory::format_tag;

memory::desc f32(const memory::dims& d, tag t) { return memory::desc(d, memory::data_type::f32, t); }

// Runs p with these arguments (the C interface: no argument map allocated per call).
void execute(const dnnl::primitive& p, const dnnl::stream& s, std::initializer_list<dnnl_exec_arg_t> args) {
  const dnnl_status_t st = dnnl_primitive_execute(p.get(), s.get(), int(args.size()), args.begin());
  if (st != dnnl_success) throw std::runtime_error("oneDNN: a convolution's primitive failed (status " + std::to_string(int(st)) + ")");
}

// Sets OpenMP's thread count for the calling thread (the setting is per thread), where it differs.
void use_threads(int n) {
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}
}  // namespace

struct OnednnConvolutions::Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// One shape's primitives. x, y and w_user take pslab's pointers at each call (x and y the
// NHWC images or their gradients, w_user the OIHW weights, dw_user their gradient); w_fwd,
// w_bwd and dw_blk are oneDNN's blocked weights, owned here (null where oneDNN takes the plain
// layout as it is).
struct OnednnConvolutions::Plan {
  memory x, y, w_user, dw_user;
  memory w_fwd, w_bwd, dw_blk;
  dnnl::primitive fwd, bwd_data, bwd_weights;
  dnnl::primitive w_to_fwd, w_to_bwd, dw_to_oihw;

  Plan(const dnnl::engine& e, const math::ConvGeometry& g, int OC, int B) {
    const memory::dim OH = g.OH(), OW = g.OW();
    const memory::dims xd{B, g.C, g.H, g.W}, yd{B, OC, OH, OW}, wd{OC, g.C, g.KH, g.KW}, strides{g.stride, g.stride};
    // The right padding that reaches the last output: what the output size implies.
    const memory::dims pad_l{g.pad, g.pad}, pad_r{(OH - 1) * g.stride + g.KH - g.H - g.pad, (OW - 1) * g.stride + g.KW - g.W - g.pad};
    const memory::desc x_md = f32(xd, tag::nhwc), y_md = f32(yd, tag::nhwc), w_any = f32(wd, tag::any);
    using namespace dnnl;
    const convolution_forward::primitive_desc fpd(
        convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, x_md, w_any, y_md, strides,
                                  pad_l, pad_r),
        e);
    const convolution_backward_data::primitive_desc dpd(
        convolution_backward_data::desc(algorithm::convolution_direct, x_md, w_any, y_md, strides, pad_l, pad_r), e, fpd);
    const convolution_backward_weights::primitive_desc wpd(
        convolution_backward_weights::desc(algorithm::convolution_direct, x_md, w_any, y_md, strides, pad_l, pad_r), e, fpd);
    for (const char* impl : {fpd.impl_info_str(), dpd.impl_info_str(), wpd.impl_info_str()})
      if (std::strncmp(impl, "ref", 3) == 0) throw std::runtime_error(std::string("only oneDNN's reference kernel: ") + impl);
    x = memory(x_md, e, DNNL_MEMORY_NONE);
    y = memory(y_md, e, DNNL_MEMORY_NONE);
    w_user = memory(f32(wd, tag::oihw), e, DNNL_MEMORY_NONE);
    dw_user = memory(f32(wd, tag::oihw), e, DNNL_MEMORY_NONE);
    if (fpd.weights_desc() != w_user.get_desc()) w_fwd = memory(fpd.weights_desc(), e), w_to_fwd = reorder(w_user, w_fwd);
    if (dpd.weights_desc() != w_user.get_desc()) w_bwd = memory(dpd.weights_desc(), e), w_to_bwd = reorder(w_user, w_bwd);
    if (wpd.diff_weights_desc() != dw_user.get_desc())
      dw_blk = memory(wpd.diff_weights_desc(), e), dw_to_oihw = reorder(dw_blk, dw_user);
    fwd = convolution_forward(fpd), bwd_data = convolution_backward_data(dpd), bwd_weights = convolution_backward_weights(wpd);
  }
};

OnednnConvolutions::OnednnConvolutions() : engine_(std::make_unique<Engine>()) {}
OnednnConvolutions::~OnednnConvolutions() = default;

OnednnConvolutions::Plan* OnednnConvolutions::plan(const math::ConvGeometry& g, int OC, int B, int threads) {
  const Key key{g.C, g.H, g.W, g.KH, g.KW, g.stride, g.pad, OC, B, threads};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  use_threads(threads);  // (oneDNN picks its kernels' blocking for this many threads)
  std::unique_ptr<Plan> p;
  try {
    p = std::make_unique<Plan>(engine_->engine, g, OC, B);
  } catch (const std::exception&) {
    // No primitive for this shape (dnnl::error: "could not create a primitive descriptor"), or
    // only the reference one: the backend's own path takes it.
  }
  return plans_.emplace(key, std::move(p)).first->second.get();
}

bool OnednnConvolutions::ready(const math::ConvGeometry& g, int OC, int B, int threads) {
  return B > 0 && plan(g, OC, B, threads) != nullptr;
}

void OnednnConvolutions::forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, int threads,
                                 float* y) {
  Plan& p = *plan(g, OC, B, threads);
  const dnnl::stream& s = engine_->stream;
  use_threads(threads);
  p.x.set_data_handle(const_cast<float*>(x));
  p.w_user.set_data_handle(const_cast<float*>(W));
  p.y.set_data_handle(y);
  if (p.w_fwd) execute(p.w_to_fwd, s, {{DNNL_ARG_FROM, p.w_user.get()}, {DNNL_ARG_TO, p.w_fwd.get()}});
  const memory& w = p.w_fwd ? p.w_fwd : p.w_user;
  execute(p.fwd, s, {{DNNL_ARG_SRC, p.x.get()}, {DNNL_ARG_WEIGHTS, w.get()}, {DNNL_ARG_DST, p.y.get()}});
}

// The weight gradient first (from forward's input), then the input gradient.
void OnednnConvolutions::backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC,
                                  int B, int threads, float* dW, float* dx) {
  Plan& p = *plan(g, OC, B, threads);
  const dnnl::stream& s = engine_->stream;
  use_threads(threads);
  p.x.set_data_handle(const_cast<float*>(x));
  p.y.set_data_handle(const_cast<float*>(dy));
  p.dw_user.set_data_handle(dW);
  const memory& dw = p.dw_blk ? p.dw_blk : p.dw_user;
  execute(p.bwd_weights, s, {{DNNL_ARG_SRC, p.x.get()}, {DNNL_ARG_DIFF_DST, p.y.get()}, {DNNL_ARG_DIFF_WEIGHTS, dw.get()}});
  if (p.dw_blk) execute(p.dw_to_oihw, s, {{DNNL_ARG_FROM, p.dw_blk.get()}, {DNNL_ARG_TO, p.dw_user.get()}});
  if (!dx) return;
  p.w_user.set_data_handle(const_cast<float*>(W));
  p.x.set_data_handle(dx);
  if (p.w_bwd) execute(p.w_to_bwd, s, {{DNNL_ARG_FROM, p.w_user.get()}, {DNNL_ARG_TO, p.w_bwd.get()}});
  const memory& w = p.w_bwd ? p.w_bwd : p.w_user;
  execute(p.bwd_data, s, {{DNNL_ARG_DIFF_DST, p.y.get()}, {DNNL_ARG_WEIGHTS, w.get()}, {DNNL_ARG_DIFF_SRC, p.x.get()}});
}

}  // namespace pslab
