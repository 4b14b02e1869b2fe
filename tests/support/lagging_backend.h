// A CPU backend whose copies beside the compute (download_async, upload_async) land late, as a
// GPU's copy engine's do: a queued copy moves its bytes only once landed() is asked about it
// `lag` times without waiting, or with waiting. Code that reads a copy's destination before
// landed() said so reads stale bytes, which the tests see. Everything else is the CPU backend's.
#pragma once

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "backend.h"

namespace pslab::test {

class LaggingBackend final : public Backend {
 public:
  // (Its convolutions: Backend's default, NCHW, over the im2col backend's im2col and GEMMs.)
  explicit LaggingBackend(int lag) : cpu_(make_cpu_backend(0, CpuConvolutions::im2col)), lag_(lag) {}

  Ticket download_async(void* host_dst, const void* src, std::size_t bytes) override { return queue(host_dst, src, bytes); }
  Ticket upload_async(void* dst, const void* host_src, std::size_t bytes) override {
    last_upload_ = queue(dst, host_src, bytes);
    return last_upload_;
  }
  bool landed(Ticket t, bool wait) override {
    if (t == 0 || t > copies_.size()) throw std::logic_error("LaggingBackend: ticket never given");
    if (t <= landed_) return true;
    if (!wait && ++asked_ < lag_) return false;
    asked_ = 0;
    for (; landed_ < t; ++landed_) {  // in order: every earlier copy lands with it
      const Copy& c = copies_[landed_];
      std::memcpy(c.dst, c.src, c.bytes);
    }
    return true;
  }
  void upload_fence() override {
    if (last_upload_) landed(last_upload_, true);  // the compute "waits": nothing runs beside it here
  }
  std::size_t copies() const { return copies_.size(); }

  // ---- the rest: the CPU backend ----
  Device device() const override { return Device::cuda; }  // as a GPU: ∇θ and its host copy differ
  std::string describe() const override { return "lagging copies over " + cpu_->describe(); }
  void* allocate(std::size_t b) override { return cpu_->allocate(b); }
  void deallocate(void* p) noexcept override { cpu_->deallocate(p); }
  void copy_from_host(void* d, const void* s, std::size_t b) override { cpu_->copy_from_host(d, s, b); }
  void copy_to_host(void* d, const void* s, std::size_t b) override { cpu_->copy_to_host(d, s, b); }
  void copy(void* d, const void* s, std::size_t b) override { cpu_->copy(d, s, b); }
  void fill(float* x, std::size_t n, float v) override { cpu_->fill(x, n, v); }
  void synchronize() override {}
  void gather_rows(const void* s, const std::uint32_t* i, std::size_t n, std::size_t rb, void* d) override {
    cpu_->gather_rows(s, i, n, rb, d);
  }
  void augment_images(const float* s, const std::uint32_t* i, std::size_t n, int C, int H, int W, std::uint64_t seed,
                      std::uint64_t epoch, int pad, float* d) override {
    cpu_->augment_images(s, i, n, C, H, W, seed, epoch, pad, d);
  }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float be,
            float* C, int ldc) override {
    cpu_->gemm(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
  }
  void axpy(std::size_t n, float a, const float* x, float* y) override { cpu_->axpy(n, a, x, y); }
  void scale(std::size_t n, float a, float* x) override { cpu_->scale(n, a, x); }
  double sum_squares(const float* x, std::size_t n) override { return cpu_->sum_squares(x, n); }
  void add_bias(float* y, const float* b, int o, int c, int i) override { cpu_->add_bias(y, b, o, c, i); }
  void bias_grad(const float* dy, int o, int c, int i, float* db) override { cpu_->bias_grad(dy, o, c, i, db); }
  void relu_forward(const float* x, float* y, std::size_t n) override { cpu_->relu_forward(x, y, n); }
  void relu_backward(const float* dy, const float* y, float* dx, std::size_t n) override { cpu_->relu_backward(dy, y, dx, n); }
  void batch_norm_forward(const float* x, int B, int C, int HW, const float* g, const float* b, bool training, float m,
                          float eps, float* rm, float* rv, float* sm, float* si, float* y) override {
    cpu_->batch_norm_forward(x, B, C, HW, g, b, training, m, eps, rm, rv, sm, si, y);
  }
  void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* g, const float* sm,
                           const float* si, float* dg, float* db, float* dx) override {
    cpu_->batch_norm_backward(x, dy, B, C, HW, g, sm, si, dg, db, dx);
  }
  double softmax_xent(const float* l, const std::int32_t* y, int r, int C, float s, float* d) override {
    return cpu_->softmax_xent(l, y, r, C, s, d);
  }
  double mse(const float* y, const float* t, int r, int C, float s, float* d) override { return cpu_->mse(y, t, r, C, s, d); }
  long count_correct(const float* l, const std::int32_t* y, int r, int C) override { return cpu_->count_correct(l, y, r, C); }
  void run(const math::Program& p, float* const* a, std::size_t n) override { cpu_->run(p, a, n); }
  void im2col(const float* x, const math::ConvGeometry& g, int B, float* c) override { cpu_->im2col(x, g, B, c); }
  void col2im(const float* c, const math::ConvGeometry& g, int B, float* dx) override { cpu_->col2im(c, g, B, dx); }
  void swap_outer(const float* x, int A, int B, int N, float* y) override { cpu_->swap_outer(x, A, B, N, y); }
  ImageLayout image_layout() const override { return cpu_->image_layout(); }

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  Ticket queue(void* dst, const void* src, std::size_t bytes) {
    copies_.push_back(Copy{dst, src, bytes});
    return copies_.size();
  }
  std::unique_ptr<Backend> cpu_;
  int lag_;
  int asked_ = 0;
  std::vector<Copy> copies_;  // every copy queued; [0, landed_) landed
  Ticket landed_ = 0, last_upload_ = 0;
};

}  // namespace pslab::test
