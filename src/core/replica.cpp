#include "core/replica.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "core/sampler.h"

namespace pslab {

Replica::Replica(Backend& be, const ModelSpec& spec, const Dataset& train, int max_batch, float* grad_host)
    : be_(be), train_(train), model_(be, spec, max_batch, be.device() == Device::cpu ? grad_host : nullptr),
      max_batch_(max_batch), grad_host_given_(grad_host) {
  const std::size_t f = std::size_t(train.features()), o = std::size_t(spec.outputs);
  x_host_ = HostBuffer<float>(be, std::size_t(max_batch) * f);
  y_host_ = HostBuffer<std::int32_t>(be, std::size_t(max_batch));
  t_host_ = HostBuffer<float>(be, std::size_t(max_batch) * o);
  if (be.device() != Device::cpu) {
    if (grad_host) grad_host_registered_ = be.register_host(grad_host, model_.num_params() * sizeof(float));
    x_dev_ = DeviceBuffer<float>(be, x_host_.size());
    y_dev_ = DeviceBuffer<std::int32_t>(be, y_host_.size());
    t_dev_ = DeviceBuffer<float>(be, t_host_.size());
    for (int k = 0; k < 2; ++k) {
      idx_host_[k] = HostBuffer<std::uint32_t>(be, std::size_t(max_batch));
      idx_dev_[k] = DeviceBuffer<std::uint32_t>(be, std::size_t(max_batch));
    }
  }
  eval_idx_.resize(std::size_t(max_batch));
}

const Replica::Resident* Replica::resident(const Dataset& d) {
  if (be_.device() == Device::cpu) {  // the data set's own arrays, nothing to keep
    cpu_view_.x = d.x.data(), cpu_view_.labels = d.labels.data(), cpu_view_.targets = d.targets.data();
    return &cpu_view_;
  }
  // The copy of this data set (the same object with the same arrays) if one was made.
  for (const auto& u : uploaded_)
    if (u.set == &d && u.x == d.x.data() && u.n == d.n) return u.copy.get();
  auto r = std::make_unique<Resident>();
  try {
    r->x_buf = DeviceBuffer<float>(be_, d.x.size());
    r->y_buf = DeviceBuffer<std::int32_t>(be_, d.labels.size());
    r->t_buf = DeviceBuffer<float>(be_, d.targets.size());
    be_.copy_from_host(r->x_buf.data(), d.x.data(), r->x_buf.bytes());
    be_.copy_from_host(r->y_buf.data(), d.labels.data(), r->y_buf.bytes());
    be_.copy_from_host(r->t_buf.data(), d.targets.data(), r->t_buf.bytes());
    r->x = r->x_buf.data(), r->labels = r->y_buf.data(), r->targets = r->t_buf.data();
  } catch (const std::runtime_error& e) {  // no room on the GPU: stage its batches through the host
    std::fprintf(stderr, "pslab: a data set of %.1f MB stays in host memory (%s); its batches are uploaded per step\n",
                 double(d.x.size() * sizeof(float)) / 1e6, e.what());
    r.reset();
  }
  uploaded_.push_back(Upload{&d, d.x.data(), d.n, std::move(r)});
  return uploaded_.back().copy.get();
}

Replica::Batch Replica::stage(const Dataset& d, std::span<const std::uint32_t> idx) {
  const std::size_t n = idx.size(), f = std::size_t(d.features()), t = std::size_t(d.target_dim);
  if (n > std::size_t(max_batch_))  // (before anything is written into buffers of max_batch rows)
    throw std::invalid_argument("a batch of " + std::to_string(n) + " samples for a replica of at most " +
                                std::to_string(max_batch_) + " (its max_batch)");
  const bool cpu = be_.device() == Device::cpu;
  float* x = cpu ? x_host_.data() : x_dev_.data();
  std::int32_t* y = cpu ? y_host_.data() : y_dev_.data();
  float* tg = cpu ? t_host_.data() : t_dev_.data();
  if (const Resident* r = resident(d)) {
    const std::uint32_t* i = idx.data();
    if (!cpu && n == 0) i = idx_dev_[0].data();
    staged_idx_ = i;
    if (!cpu && n > 0) {  // only the indices cross to the GPU, queued: the gathers wait on the device
      i = device_indices(idx);
      staged_idx_ = i;
    }
    be_.gather_rows(r->x, i, n, f * sizeof(float), x);
    if (d.classes > 0) be_.gather_rows(r->labels, i, n, sizeof(std::int32_t), y);
    else be_.gather_rows(r->targets, i, n, t * sizeof(float), tg);
    return {x, y, tg};
  }
  gather_batch(d, idx, x_host_.data(), y_host_.data(), t_host_.data());
  staged_idx_ = cpu ? idx.data() : nullptr;
  be_.copy_from_host(x_dev_.data(), x_host_.data(), n * f * sizeof(float));
  if (d.classes > 0) be_.copy_from_host(y_dev_.data(), y_host_.data(), n * sizeof(std::int32_t));
  else be_.copy_from_host(t_dev_.data(), t_host_.data(), n * t * sizeof(float));
  return {x_dev_.data(), y_dev_.data(), t_dev_.data()};
}

const std::uint32_t* Replica::device_indices(std::span<const std::uint32_t> idx) {
  const std::size_t n = idx.size();
  if (sampler_) {
    const std::span<const std::uint32_t> shard = sampler_->shard();
    const auto at = reinterpret_cast<std::uintptr_t>(idx.data()), lo = reinterpret_cast<std::uintptr_t>(shard.data());
    if (at >= lo && at + idx.size_bytes() <= lo + shard.size_bytes()) {
      if (shard_epoch_ != sampler_->epoch()) upload_shard(shard);
      return shard_dev_.data() + (idx.data() - shard.data());
    }
  }
  const int k = idx_slot_;
  idx_slot_ ^= 1;
  if (idx_copied_[k]) be_.landed(idx_copied_[k], /*wait*/ true);  // the slot's last copy has read it
  std::memcpy(idx_host_[k].data(), idx.data(), n * sizeof(std::uint32_t));
  idx_copied_[k] = be_.upload_async(idx_dev_[k].data(), idx_host_[k].data(), n * sizeof(std::uint32_t));
  be_.upload_fence();
  return idx_dev_[k].data();
}

// The epoch's shard to the device: the copy waits (on the device) for the gathers queued before
// it, which read the last epoch's, and the gathers after it wait for the copy.
void Replica::upload_shard(std::span<const std::uint32_t> shard) {
  if (shard_copied_) be_.landed(shard_copied_, /*wait*/ true);  // the last epoch's copy has read the pinned one
  if (shard_host_.size() < shard.size()) {
    shard_host_ = HostBuffer<std::uint32_t>(be_, shard.size());
    shard_dev_ = DeviceBuffer<std::uint32_t>(be_, shard.size());
  }
  std::memcpy(shard_host_.data(), shard.data(), shard.size_bytes());
  shard_copied_ = be_.upload_async(shard_dev_.data(), shard_host_.data(), shard.size_bytes());
  be_.upload_fence();
  shard_epoch_ = sampler_->epoch();
}

void Replica::follow(const ShardSampler& sampler) {
  if (be_.device() == Device::cpu) return;
  sampler_ = &sampler;
  shard_epoch_ = -1;
}

Replica::Batch Replica::slice(const Dataset& d, int lo, int n) {
  if (const Resident* r = resident(d)) {
    const std::size_t f = std::size_t(d.features()), t = std::size_t(d.target_dim), l = std::size_t(lo);
    return {r->x + l * f, d.classes > 0 ? r->labels + l : nullptr, d.classes > 0 ? nullptr : r->targets + l * t};
  }
  std::iota(eval_idx_.begin(), eval_idx_.begin() + n, std::uint32_t(lo));
  return stage(d, {eval_idx_.data(), std::size_t(n)});
}

double Replica::compute_gradient(std::span<const std::uint32_t> idx, float grad_scale, GradListener* listener) {
  return step(idx, grad_scale, listener, nullptr);
}

double Replica::train_step(std::span<const std::uint32_t> idx, Optimizer& opt, double lr) {
  if (opt.size() != model_.num_params())
    throw std::logic_error("Replica::train_step: an optimizer of " + std::to_string(opt.size()) + " parameters for a model of " +
                           std::to_string(model_.num_params()));
  if (idx.empty()) return compute_gradient(idx);  // an empty batch moves nothing
  if (graphs_ == StepGraphs::off || !opt.records()) {
    const double loss = compute_gradient(idx);
    opt.step(model_.params(), model_.grads(), lr);
    return loss;
  }
  opt.use_live_scalars();
  opt.begin_live_step(lr);  // (outside any recording: its scalars are written before the step's work)
  return step(idx, -1.0f, nullptr, &opt);
}

double Replica::step(std::span<const std::uint32_t> idx, float grad_scale, GradListener* listener, Optimizer* update) {
  Batch b = stage(train_, idx);
  if (augment_ && !idx.empty()) {
    const std::uint32_t* i = staged_idx_;
    if (!i) {  // (a GPU whose data set did not fit: the indices were not uploaded)
      be_.copy_from_host(augment_idx_.data(), idx.data(), idx.size() * sizeof(std::uint32_t));
      i = augment_idx_.data();
    }
    be_.augment_images(b.x, i, idx.size(), train_.channels, train_.height, train_.width, augment_seed_, std::uint64_t(epoch_),
                       augment_pad_, augmented_.data());
    b.x = augmented_.data();
  }
  const int B = int(idx.size());
  if (B > 0 && graphs_ != StepGraphs::off)
    if (const std::optional<double> loss = graphed_step(b, B, grad_scale, listener != nullptr, update)) {
      if (listener) listener->ready(0);
      return *loss;
    }
  const double loss = model_.forward_backward(b.x, b.labels, b.targets, B, grad_scale, listener);
  if (update) update->update(model_.params(), model_.grads(), model_.params());
  return loss;
}

std::vector<Model::PassTimes> Replica::profile_step(std::span<const std::uint32_t> idx, Optimizer& opt, double lr,
                                                    int reps) {
  const int B = int(idx.size());
  Model::PassTimes gather{"gather"}, update{"update"};
  std::vector<Model::PassTimes> passes;
  for (int round = 0; round <= reps; ++round) {  // (round 0: untimed)
    auto ms = [&](auto&& work) { return round ? synchronized_ms(be_, work) / reps : (work(), 0.0); };
    Batch b{};
    gather.forward_ms += ms([&] { b = stage(train_, idx); });
    const auto model = model_.profile_passes(b.x, b.labels, b.targets, B, 1);
    if (round == 1) passes.assign(model.size(), {});
    for (std::size_t i = 0; round > 0 && i < model.size(); ++i) {
      passes[i].pass = model[i].pass;
      passes[i].forward_ms += model[i].forward_ms / reps, passes[i].backward_ms += model[i].backward_ms / reps;
    }
    update.forward_ms += ms([&] { opt.step(model_.params(), model_.grads(), lr); });
  }
  passes.insert(passes.begin(), gather);
  passes.push_back(update);
  return passes;
}

StepGraphs step_graphs_from(const std::string& value) {
  if (value == "off") return StepGraphs::off;
  if (value == "auto") return StepGraphs::automatic;
  if (value == "on") return StepGraphs::on;
  throw std::invalid_argument("train.cuda_graphs = \"" + value + "\": expected \"auto\", \"on\" or \"off\"");
}

void Replica::use_step_graphs(StepGraphs s) {
  if (s == StepGraphs::on && !be_.records_graphs())
    throw std::invalid_argument("train.cuda_graphs = \"on\": " + be_.describe() +
                                " records no graphs (it runs each op as it is queued); use \"auto\" or \"off\"");
  graphs_ = be_.records_graphs() ? s : StepGraphs::off;
  graph_.reset();
  warm_shape_ = graph_shape_ = StepShape{};
}

std::optional<double> Replica::graphed_step(const Batch& b, int B, float grad_scale, bool listened, Optimizer* update) {
  if (graphs_ == StepGraphs::automatic && listened && model_.num_params() * sizeof(float) > kGraphsBeforeOverlapBytes)
    return std::nullopt;
  const StepShape shape{b.x, b.labels, b.targets, B, grad_scale, update ? update->identity() : 0};
  if (graph_) {  // one shape has a graph (the run's full batch): another runs as usual
    if (!(shape == graph_shape_)) return std::nullopt;
    if (be_.replay(*graph_)) {
      ++graphed_steps_;
      return be_.take_loss() / B;
    }
    graph_.reset();  // a buffer it used moved (one grew since): this step runs as usual, the next is recorded
    warm_shape_ = shape;
    return std::nullopt;
  }
  if (!(shape == warm_shape_)) {
    warm_shape_ = shape;  // the first step of this shape runs as usual (cuDNN's plans, scratch sizes)
    return std::nullopt;
  }
  if (!record_step(b, B, grad_scale, update)) return std::nullopt;
  graph_shape_ = shape;
  if (!be_.replay(*graph_)) throw std::logic_error("Replica: a step graph refused to replay right after its recording");
  ++graphed_steps_;
  return be_.take_loss() / B;
}

bool Replica::record_step(const Batch& b, int B, float grad_scale, Optimizer* update) {
  std::string why;
  bool began = false;
  try {
    be_.begin_recording();
    began = true;
    model_.queue_forward_backward(b.x, b.labels, b.targets, B, grad_scale, nullptr);
    if (update) update->update(model_.params(), model_.grads(), model_.params());
  } catch (const std::exception& e) {
    why = e.what();
  }
  std::string ended_why;
  if (began) graph_ = be_.end_recording(&ended_why);  // (ends a recording cut short, too)
  if (graph_ && why.empty()) {
    ++recordings_;
    return true;
  }
  graph_.reset();
  if (why.empty()) why = ended_why;
  if (graphs_ == StepGraphs::on)
    throw std::runtime_error("train.cuda_graphs = \"on\": a step of batch " + std::to_string(B) + " cannot be recorded on " +
                             be_.describe() + ": " + why);
  std::fprintf(stderr, "pslab: steps run without CUDA graphs: a step of batch %d cannot be recorded on %s: %s "
               "(train.cuda_graphs = \"auto\")\n", B, be_.describe().c_str(), why.c_str());
  graphs_ = StepGraphs::off;
  return false;
}

void Replica::augment(std::uint64_t seed, int pad) {
  if (train_.height < 2 || train_.width < 2)
    throw std::invalid_argument("data.augment: crops and flips need images; this data set's samples are " +
                                std::to_string(train_.channels) + "x" + std::to_string(train_.height) + "x" +
                                std::to_string(train_.width));
  augment_ = true, augment_seed_ = seed, augment_pad_ = pad;
  augmented_ = DeviceBuffer<float>(be_, std::size_t(max_batch_) * std::size_t(train_.features()));
  if (be_.device() != Device::cpu) augment_idx_ = DeviceBuffer<std::uint32_t>(be_, std::size_t(max_batch_));
}

Replica::~Replica() {
  if (!grad_host_registered_) return;
  try {
    be_.synchronize();  // no copy still writes into it
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pslab: waiting for the device before unregistering the gradient's memory: %s\n", e.what());
  }
  be_.unregister_host(grad_host_given_);
}

float* Replica::host_params() {
  if (be_.device() == Device::cpu) return model_.params();
  if (theta_host_.empty()) theta_host_ = HostBuffer<float>(be_, model_.num_params());
  return theta_host_.data();
}

void Replica::upload_params() {
  if (be_.device() == Device::cpu) return;
  params_landed();  // (an earlier piece's copy must not land after this one)
  be_.copy_from_host(model_.params(), host_params(), model_.num_params() * sizeof(float));
}

const float* Replica::download_params() {
  if (be_.device() == Device::cpu) return model_.params();
  params_landed();  // (its host buffer is what they still read)
  float* host = host_params();
  be_.copy_to_host(host, model_.params(), model_.num_params() * sizeof(float));
  return host;
}

float* Replica::host_grads() {
  if (be_.device() == Device::cpu) return model_.grads();
  if (grad_host_given_) return grad_host_given_;
  if (grad_host_.empty()) grad_host_ = HostBuffer<float>(be_, model_.num_params());
  return grad_host_.data();
}

const float* Replica::download_grads() {
  if (be_.device() == Device::cpu) return model_.grads();
  float* host = host_grads();
  be_.copy_to_host(host, model_.grads(), model_.num_params() * sizeof(float));
  return host;
}

void Replica::upload_params_async(std::size_t lo, std::size_t n) {
  if (be_.device() == Device::cpu || n == 0) return;
  if (lo > model_.num_params() || n > model_.num_params() - lo)
    throw std::out_of_range("Replica::upload_params_async: floats [" + std::to_string(lo) + ", " + std::to_string(lo + n) +
                            ") of a θ of " + std::to_string(model_.num_params()));
  params_uploaded_ = be_.upload_async(model_.params() + lo, host_params() + lo, n * sizeof(float));
}

void Replica::params_landed() {
  if (params_uploaded_) be_.landed(params_uploaded_, /*wait*/ true);
  params_uploaded_ = 0;
}

void Replica::params_fence() { be_.upload_fence(); }

void Replica::measure_statistics() {
  if (model_.state_floats() == 0 || train_.n == 0) return;
  const int batch = std::min({max_batch_, kStatisticsBatch, train_.n});
  Rng rng(0x57A75u);  // fixed: the same samples whatever the run
  for (int k = 0; k * batch < kStatisticsSamples; ++k) {
    for (int i = 0; i < batch; ++i) eval_idx_[std::size_t(i)] = std::uint32_t(rng.below(std::uint64_t(train_.n)));
    const Batch b = stage(train_, {eval_idx_.data(), std::size_t(batch)});
    model_.measure_statistics(b.x, batch, k);
  }
}

EvalCounts Replica::evaluate(const Dataset& d) {
  measure_statistics();
  EvalCounts total;
  for (int lo = 0; lo < d.n; lo += max_batch_) {
    const int n = std::min(max_batch_, d.n - lo);
    const Batch b = slice(d, lo, n);
    const EvalCounts c = model_.evaluate(b.x, b.labels, b.targets, n);
    total.loss_sum += c.loss_sum;
    total.correct += c.correct;
    total.samples += c.samples;
  }
  return total;
}

}  // namespace pslab
