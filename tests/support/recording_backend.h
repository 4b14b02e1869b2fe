// A CPU backend that records step graphs as a GPU's does (Backend::begin_recording): between
// begin_recording() and end_recording() its ops are kept, not run, and a replay runs them again
// on the memory they named, with the values it holds then. Ops the CUDA backend refuses while
// recording (a host value, a wait, a host copy, an allocation) throw std::logic_error here too,
// and after move_buffers() the next replay is refused as stale, as a CUDA graph is once a buffer
// it used moved. refuse_while_recording("relu_forward") makes that op refuse too: a step that
// cannot be recorded. So Replica's use of graphs is tested on the CPU; tests/gpu.sh checks the
// CUDA backend's.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"

namespace pslab::test {

class RecordingBackend final : public Backend {
 public:
  // (Its convolutions: Backend's default, NCHW, over the im2col backend's im2col and GEMMs.)
  RecordingBackend() : cpu_(make_cpu_backend(0, CpuConvolutions::im2col)) {}

  // ---- recording ----
  bool records_graphs() const override { return true; }
  void begin_recording() override {
    refuse("begin_recording");
    recording_ = true, ops_.clear();
  }
  std::unique_ptr<Graph> end_recording(std::string* why) override {
    if (!recording_) throw std::logic_error("RecordingBackend: end_recording without begin_recording");
    recording_ = false;
    if (cut_short_) {  // an op refused: the recording is invalid, as a CUDA capture would be
      cut_short_ = false;
      if (why) *why = "an op refused while recording";
      return nullptr;
    }
    auto g = std::make_unique<Recorded>();
    g->ops = std::move(ops_);
    g->generation = generation_;
    ++recordings_;
    return g;
  }
  bool replay(Graph& g) override {
    refuse("replay");
    auto& r = dynamic_cast<Recorded&>(g);
    if (r.generation != generation_) return false;
    for (auto& op : r.ops) op();
    ++replays_;
    return true;
  }
  // Buffers a graph used moved: the next replay of a graph recorded before is refused.
  void move_buffers() { ++generation_; }
  void refuse_while_recording(std::string op) { refused_op_ = std::move(op); }
  long recordings() const { return recordings_; }
  long replays() const { return replays_; }
  long scalar_writes() const { return scalar_writes_; }

  // ---- host values, waits, host copies, allocations: refused while recording ----
  Device device() const override { return Device::cuda; }  // as a GPU: its own ∇θ, host copies apart
  std::string describe() const override { return "recording over " + cpu_->describe(); }
  void* allocate(std::size_t b) override { return refuse("allocate"), cpu_->allocate(b); }
  void deallocate(void* p) noexcept override { cpu_->deallocate(p); }
  void* allocate_host(std::size_t b) override { return refuse("allocate_host"), Backend::allocate_host(b); }
  void copy_from_host(void* d, const void* s, std::size_t b) override { refuse("copy_from_host"), cpu_->copy_from_host(d, s, b); }
  void copy_to_host(void* d, const void* s, std::size_t b) override { refuse("copy_to_host"), cpu_->copy_to_host(d, s, b); }
  void synchronize() override { refuse("synchronize"); }
  void write_scalars(float* d, const float* v, int n) override {
    refuse("write_scalars");  // (a recording would keep the values: the CUDA backend refuses it too)
    ++scalar_writes_;
    cpu_->write_scalars(d, v, n);
  }
  double sum_squares(const float* x, std::size_t n) override { return refuse("sum_squares"), cpu_->sum_squares(x, n); }
  double softmax_xent(const float* l, const std::int32_t* y, int r, int C, float s, float* d) override {
    return refuse("softmax_xent"), cpu_->softmax_xent(l, y, r, C, s, d);
  }
  double mse(const float* y, const float* t, int r, int C, float s, float* d) override {
    return refuse("mse"), cpu_->mse(y, t, r, C, s, d);
  }
  long count_correct(const float* l, const std::int32_t* y, int r, int C) override {
    return refuse("count_correct"), cpu_->count_correct(l, y, r, C);
  }
  double take_loss() override { return refuse("take_loss"), pending_loss_; }
  void softmax_xent_deferred(const float* l, const std::int32_t* y, int r, int C, float s, float* d) override {
    queue("softmax_xent_deferred", [=, this] { pending_loss_ = cpu_->softmax_xent(l, y, r, C, s, d); });
  }
  void mse_deferred(const float* y, const float* t, int r, int C, float s, float* d) override {
    queue("mse_deferred", [=, this] { pending_loss_ = cpu_->mse(y, t, r, C, s, d); });
  }

  // ---- the device work: kept while recording, else run ----
  void copy(void* d, const void* s, std::size_t b) override { queue("copy", [=, this] { cpu_->copy(d, s, b); }); }
  void fill(float* x, std::size_t n, float v) override { queue("fill", [=, this] { cpu_->fill(x, n, v); }); }
  void gather_rows(const void* s, const std::uint32_t* i, std::size_t n, std::size_t rb, void* d) override {
    queue("gather_rows", [=, this] { cpu_->gather_rows(s, i, n, rb, d); });
  }
  void augment_images(const float* s, const std::uint32_t* i, std::size_t n, int C, int H, int W, std::uint64_t seed,
                      std::uint64_t epoch, int pad, float* d) override {
    queue("augment_images", [=, this] { cpu_->augment_images(s, i, n, C, H, W, seed, epoch, pad, d); });
  }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float be,
            float* C, int ldc) override {
    queue("gemm", [=, this] { cpu_->gemm(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc); });
  }
  void axpy(std::size_t n, float a, const float* x, float* y) override { queue("axpy", [=, this] { cpu_->axpy(n, a, x, y); }); }
  void scale(std::size_t n, float a, float* x) override { queue("scale", [=, this] { cpu_->scale(n, a, x); }); }
  void add_bias(float* y, const float* b, int o, int c, int i) override {
    queue("add_bias", [=, this] { cpu_->add_bias(y, b, o, c, i); });
  }
  void bias_grad(const float* dy, int o, int c, int i, float* db) override {
    queue("bias_grad", [=, this] { cpu_->bias_grad(dy, o, c, i, db); });
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    queue("relu_forward", [=, this] { cpu_->relu_forward(x, y, n); });
  }
  void relu_backward(const float* dy, const float* y, float* dx, std::size_t n) override {
    queue("relu_backward", [=, this] { cpu_->relu_backward(dy, y, dx, n); });
  }
  void batch_norm_forward(const float* x, int B, int C, int HW, const float* g, const float* b, bool training, float m,
                          float eps, float* rm, float* rv, float* sm, float* si, float* y) override {
    queue("batch_norm_forward", [=, this] { cpu_->batch_norm_forward(x, B, C, HW, g, b, training, m, eps, rm, rv, sm, si, y); });
  }
  void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* g, const float* sm,
                           const float* si, float* dg, float* db, float* dx) override {
    queue("batch_norm_backward", [=, this] { cpu_->batch_norm_backward(x, dy, B, C, HW, g, sm, si, dg, db, dx); });
  }
  void run(const math::Program& p, float* const* a, std::size_t n) override {
    std::vector<float*> arrays(a, a + p.arrays);  // (the caller's array of pointers may not outlive the call)
    queue("run", [=, this] { cpu_->run(p, arrays.data(), n); });
  }
  void im2col(const float* x, const math::ConvGeometry& g, int B, float* c) override {
    queue("im2col", [=, this] { cpu_->im2col(x, g, B, c); });
  }
  void col2im(const float* c, const math::ConvGeometry& g, int B, float* dx) override {
    queue("col2im", [=, this] { cpu_->col2im(c, g, B, dx); });
  }
  void swap_outer(const float* x, int A, int B, int N, float* y) override {
    queue("swap_outer", [=, this] { cpu_->swap_outer(x, A, B, N, y); });
  }
  ImageLayout image_layout() const override { return cpu_->image_layout(); }

 private:
  struct Recorded final : Graph {
    std::vector<std::function<void()>> ops;
    long generation = 0;
  };
  // Throws, and spoils the recording, where `op` may not be recorded.
  void refuse(const char* op) {
    if (!recording_) return;
    cut_short_ = true;
    throw std::logic_error(std::string("RecordingBackend: ") + op + " cannot be recorded in a step graph");
  }
  void queue(const char* op, std::function<void()> fn) {
    if (recording_ && op == refused_op_) refuse(op);
    if (recording_) ops_.push_back(std::move(fn));
    else fn();
  }
  std::unique_ptr<Backend> cpu_;
  bool recording_ = false, cut_short_ = false;
  std::vector<std::function<void()>> ops_;
  long generation_ = 0, recordings_ = 0, replays_ = 0, scalar_writes_ = 0;
  std::string refused_op_;
};

}  // namespace pslab::test
