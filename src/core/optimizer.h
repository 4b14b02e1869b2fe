// Optimizers over a contiguous range of parameters, and the learning-rate schedule.
//
// The same Optimizer runs in a single-process trainer, in an all-reduce replica (over all of
// θ) and on a parameter server (over its shard of θ): it sees one flat range, nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "core/registry.h"

namespace pslab {

struct OptimizerConfig {
  std::string kind = "sgd";  // an optimizer of core/optimizers/: "sgd", "momentum", "nesterov", "adam", "lars", "lamb"
  double lr = 0.1;           // base learning rate (before schedule and scaling)
  double momentum = 0.9;     // momentum / nesterov / lars
  double weight_decay = 0.0; // L2, added to the gradient (lamb: decoupled, added to the update)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam / lamb
  double trust = 0.001;      // lars: the trust coefficient η of the layer-wise rate
  bool staleness_lr = false;  // servers: each update's step / max(1, its staleness) (Zhang et al. 2016)
};

// Learning rate as a function of training progress in epochs (fractional: samples applied /
// training-set size), so that every consistency mode follows the same curve.
struct ScheduleConfig {
  std::string kind = "constant";  // "constant", "step", "cosine"
  double warmup_epochs = 0.0;     // linear ramp from warmup_start_factor * lr to lr
  double warmup_start_factor = 0.0;
  std::vector<double> milestones; // step: multiply by gamma at each of these epochs
  double gamma = 0.1;
  double min_lr_factor = 0.0;     // cosine: final lr = min_lr_factor * lr
  double total_epochs = 1.0;      // cosine: length of the decay (set from the run's epochs)
  // Linear scaling rule (Goyal et al. 2017): lr *= global_batch / base_batch.
  bool scale_lr = false;
  int base_batch = 64;
};

// The learning rate at `epoch` for base rate `lr` and global batch `global_batch`.
double learning_rate(const ScheduleConfig& s, double lr, int global_batch, double epoch);

// Throws std::invalid_argument naming the field if a value is out of range.
void validate(const OptimizerConfig& o);
void validate(const ScheduleConfig& s);

// What an optimizer kind does (one file each in core/optimizers/, a line each in its registry),
// composed of the backend's element-wise programs and vector primitives: no backend method of
// its own. The Optimizer below owns the state buffers it asks for and the step count.
struct OptimizerStep {
  Backend& be;
  const OptimizerConfig& cfg;
  float* const* state;  // state_buffers() buffers, each the whole range (index them with `offset`)
  long step;            // 1-based, this update's
  double lr;            // this update's, scheduled
  // Live scalars (Optimizer::use_live_scalars; null: none): math::Program::kMaxLive floats on the
  // device holding this step's live_values(), which the update's programs read as they run
  // (math::Program::live) rather than lr and step as written.
  const float* live = nullptr;
  // −lr and lr as a program's scalar: slots 1 and 0 of `live`, or the values.
  math::Scalar neg_lr() const { return live ? math::Scalar::live(1) : math::Scalar(-float(lr)); }
  math::Scalar lr_scalar() const { return live ? math::Scalar::live(0) : math::Scalar(float(lr)); }
};
class OptimizerRule {
 public:
  virtual ~OptimizerRule() = default;
  // Buffers of the range's size it keeps across steps, zero at first (momentum: 1, adam: 2), in
  // the order checkpoints keep them.
  virtual int state_buffers() const { return 0; }
  // Whether an update must see the whole range before any piece of it (prepare(): layer-wise
  // trust ratios): then a server takes pushes whole, not in pieces (ps/pieces.h).
  virtual bool needs_whole_range() const { return false; }
  // Before the pieces of an update, over the whole range: w and g (n floats; `layer_begin`
  // locates the layers in it, with n at the end). Layer-wise kinds take their trust ratios here.
  virtual void prepare(const OptimizerStep&, const float* /*w*/, const float* /*g*/,
                       const std::vector<std::size_t>& /*layer_begin*/) {}
  // One piece [offset, offset + n) of the update: w, g and w_out point at the piece (w_out == w
  // or not overlapping it).
  virtual void update(const OptimizerStep& s, const float* w, const float* g, float* w_out, std::size_t offset,
                      std::size_t n, const std::vector<std::size_t>& layer_begin) = 0;
  // The trust ratio of each layer in the last prepare() (layer-wise kinds; empty otherwise).
  virtual const std::vector<double>& trust_ratios() const {
    static const std::vector<double> none;
    return none;
  }
  // Whether its update can be recorded in a step graph: with OptimizerStep::live set, every
  // scalar that changes from step to step is read from there, and prepare() does nothing (the
  // layer-wise kinds' norms come back to the host: they cannot).
  virtual bool records() const { return false; }
  // A step's live scalars into out (math::Program::kMaxLive floats at most); returns how many:
  // by default lr and −lr.
  virtual int live_values(const OptimizerStep& s, float* out) const {
    out[0] = float(s.lr);
    out[1] = -float(s.lr);
    return 2;
  }
};
// optimizer.kind -> rule. Built-ins: sgd, momentum, nesterov, adam, lars, lamb
// (core/optimizers/registry.cpp).
Registry<OptimizerRule>& optimizer_registry();

// An optimizer over `n` parameters on `be`'s device: its kind's rule (optimizer.kind), its state
// buffers and its step count.
//
// The layer-wise optimizers scale each layer's step by a trust ratio computed over that layer:
//   lars (You et al. 2017)  t = η ||w|| / (||g|| + wd ||w||);  v = μ v + t (g + wd w);  w −= lr v
//   lamb (You et al. 2019)  r = m̂ / (√v̂ + ε) + wd w (Adam's moments, bias-corrected);
//                           t = ||w|| / ||r||;  w −= lr t r
// (t = 1 where ||w|| or the other norm is 0, e.g. a layer of zeros). `layers`: the sizes of the
// consecutive layers that make up the optimizer's n parameters (Model::param_info; on a server,
// the whole layers of its shard: shard_range() splits none for these kinds); empty: one layer. They read the whole update first (prepare()), then apply it in pieces.
// Threading: one thread at a time, except step_range() on disjoint pieces after prepare().
class Optimizer {
 public:
  // Throws std::invalid_argument naming the field for a bad config or an unknown kind.
  Optimizer(Backend& be, const OptimizerConfig& cfg, std::size_t n, std::vector<std::size_t> layers = {});
  // One update of w (n) with gradient g (n) at learning rate lr (already scheduled), in place.
  void step(float* w, const float* g, double lr) { step(w, g, w, lr); }
  // The same, writing the updated weights to w_out (n floats, w_out == w or not overlapping).
  void step(const float* w, const float* g, float* w_out, double lr) {
    if (live_scalars()) return begin_live_step(lr), update(w, g, w_out);
    begin_step();
    prepare(w, g);
    step_range(w, g, w_out, 0, n_, lr);
  }
  // One update in pieces (e.g. chunk by chunk while each is in cache): begin_step() and
  // prepare(w, g) on the whole range once, then step_range() over consecutive pieces; w, g
  // and w_out point at the piece (n floats) and `offset` locates it in the optimizer's range
  // (for its state). Equals step().
  void begin_step() { ++steps_; }
  void cancel_step() { --steps_; }  // a step begun and abandoned before it changed any state
  void prepare(const float* w, const float* g);
  void step_range(const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n, double lr);
  // Whether the optimizer keeps state across steps (an update that is abandoned half-way
  // would leave stateful optimizers inconsistent).
  bool stateless() const { return state_.empty(); }
  // Whether prepare() reads the whole range before any piece is updated (lars, lamb).
  bool needs_whole_range() const { return rule_->needs_whole_range(); }
  // The trust ratio of each layer in the last prepare() (layer-wise kinds; empty otherwise).
  const std::vector<double>& trust_ratios() const { return rule_->trust_ratios(); }
  long steps() const { return steps_; }
  std::size_t size() const { return n_; }
  // The state a checkpoint keeps: the step count and the state buffers in order (momentum and
  // nesterov: velocity; adam: m, then v; sgd: none), each size() floats, copied to the host.
  std::vector<std::vector<float>> state() const;
  // Restores what state() returned; throws std::invalid_argument naming what does not fit.
  void restore(long steps, const std::vector<std::vector<float>>& buffers);
  const OptimizerConfig& config() const { return cfg_; }

  // ---- step graphs (Replica::train_step) ----
  // Whether its kind's update can be recorded in a step graph (OptimizerRule::records: sgd,
  // momentum, nesterov, adam; not lars, lamb).
  bool records() const { return rule_->records(); }
  // From now on its programs read the learning rate and the other scalars that change from step
  // to step from device memory, which begin_live_step(lr) writes (Backend::write_scalars, only when
  // they changed: a constant rate is written once), so that an update recorded once replays with
  // each step's. The same kernels run whether recorded or not: recorded steps give bitwise the
  // values of steps run so (sgd without weight decay runs as a program, not the BLAS's axpy).
  // Throws std::logic_error for a kind that does not record.
  void use_live_scalars();
  bool live_scalars() const { return !live_.empty(); }
  // With live scalars: begin_step() and its scalars at `lr` written, then update(w, g, w_out)
  // over the whole range (which may be recorded: it queues device work only). step() does both;
  // step_range() is refused.
  void begin_live_step(double lr);
  void update(const float* w, const float* g, float* w_out);
  // A number unique to this optimizer in the process (a step graph that recorded its update
  // replays only for it).
  std::uint64_t identity() const { return identity_; }

 private:
  OptimizerStep context(double lr) {
    return OptimizerStep{be_, cfg_, state_ptrs_.data(), steps_, lr, live_.empty() ? nullptr : live_.data()};
  }
  void apply_range(const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n, double lr);
  Backend& be_;
  OptimizerConfig cfg_;
  std::size_t n_;
  long steps_ = 0;
  std::unique_ptr<OptimizerRule> rule_;
  std::vector<std::size_t> layer_begin_;  // each layer's first index, and n at the end
  std::vector<DeviceBuffer<float>> state_;
  std::vector<float*> state_ptrs_;
  DeviceBuffer<float> live_;                     // use_live_scalars(): math::Program::kMaxLive floats
  float live_written_[math::Program::kMaxLive] = {};  // what begin_live_step() wrote there last
  bool live_written_once_ = false;
  double live_lr_ = 0.0;  // the rate begin_live_step() was given last
  std::uint64_t identity_;
};

}  // namespace pslab
