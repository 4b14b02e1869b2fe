#include "core/model.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace pslab {

namespace {
// An external model's θ0: exactly P float32 values in `path`.
std::vector<float> read_theta_file(const std::string& path, std::size_t P) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::invalid_argument("model.theta_file " + path + ": cannot open it (" + std::strerror(errno) + ")");
  std::vector<float> theta(P);
  const std::size_t got = std::fread(theta.data(), sizeof(float), P, f);
  const bool more = std::fgetc(f) != EOF;
  std::fclose(f);
  if (got != P || more)
    throw std::invalid_argument("model.theta_file " + path + ": holds " + (more ? "more than " : "") +
                                std::to_string(got) + " float32 values; model.sizes add up to " + std::to_string(P));
  return theta;
}
}  // namespace

std::vector<std::unique_ptr<Layer>> build_layers(const ModelSpec& spec) {
  return model_registry().make(spec.kind)->layers(spec);
}

std::size_t count_params(const ModelSpec& spec) {
  std::size_t p = 0;
  for (const auto& l : build_layers(spec)) p += l->num_params();
  return p;
}

bool has_state(const ModelSpec& spec) {
  for (const auto& l : build_layers(spec))
    if (l->state_floats() > 0) return true;
  return false;
}

std::vector<float> initial_params(const ModelSpec& spec, std::uint64_t seed) {
  const auto layers = build_layers(spec);
  std::vector<float> theta(count_params(spec), 0.0f);
  if (spec.kind == "external") return spec.theta_file.empty() ? theta : read_theta_file(spec.theta_file, theta.size());
  if (spec.init == "zeros") return theta;
  if (spec.init != "he") throw std::invalid_argument("unknown model init \"" + spec.init + "\" (expected \"he\" or \"zeros\")");
  std::size_t off = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Rng rng = Rng::derive(seed, {0x1A7E5u, i});
    layers[i]->init_params(theta.data() + off, rng);
    off += layers[i]->num_params();
  }
  return theta;
}

Model::Model(Backend& be, const ModelSpec& spec, int max_batch, float* grad_storage)
    : be_(be), spec_(spec), max_batch_(max_batch), layers_(build_layers(spec)) {
  if (max_batch < 1) throw std::invalid_argument("Model: max_batch must be >= 1");
  if (grad_storage && be.device() != Device::cpu) throw std::invalid_argument("Model: grad_storage is for CPU backends");
  const std::size_t P = count_params(spec);
  params_ = DeviceBuffer<float>(be, P);
  if (!grad_storage) grads_ = DeviceBuffer<float>(be, P);
  grads_ptr_ = grad_storage ? grad_storage : grads_.data();
  std::size_t state = 0;
  for (const auto& l : layers_) state += l->state_floats();
  state_ = DeviceBuffer<float>(be, state);
  std::size_t off = 0, state_off = 0;
  std::size_t widest = std::size_t(spec.channels) * spec.height * spec.width;
  acts_.emplace_back();  // the input is the caller's buffer
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    l.bind(params_.data() + off, grads_ptr_ + off);
    off += l.num_params();
    l.bind_state(state_.data() + state_off);
    state_off += l.state_floats();
    acts_.emplace_back(be, std::size_t(max_batch) * l.out().size());
    scratch_.emplace_back(be, l.scratch_floats(be, max_batch));
    widest = std::max(widest, std::size_t(l.out().size()));
  }
  if (layers_.back()->out().size() != spec.outputs)
    throw std::logic_error("Model: last layer width differs from spec.outputs");
  dout_ = DeviceBuffer<float>(be, std::size_t(max_batch) * spec.outputs);
  dping_ = DeviceBuffer<float>(be, std::size_t(max_batch) * widest);
  dpong_ = DeviceBuffer<float>(be, std::size_t(max_batch) * widest);
  inputs_.resize(layers_.size());
  if (be.image_layout() != ImageLayout::nchw && spec.channels > 1 && spec.height * spec.width > 1)
    relaid_input_ = DeviceBuffer<float>(be, std::size_t(max_batch) * spec.channels * spec.height * spec.width);
  be.fill(params_.data(), params_.size(), 0.0f);
  be.fill(grads_ptr_, P, 0.0f);
  reset_state();
}

void Model::init(std::uint64_t seed) {
  load_params(initial_params(spec_, seed).data());
  reset_state();
}

void Model::reset_state() {
  std::vector<float> s(state_.size());
  std::size_t off = 0;
  for (const auto& l : layers_) l->init_state(s.data() + off), off += l->state_floats();
  load_state(s.data());
}

void Model::load_state(const float* host) { be_.copy_from_host(state_.data(), host, state_.bytes()); }

void Model::store_state(float* host) const { be_.copy_to_host(host, state_.data(), state_.bytes()); }

void Model::measure_statistics(const float* x, int B, int k) {
  if (B > 0) forward(x, B, ForwardMode{true, 1.0f / float(k + 1)});
}

void Model::load_params(const float* host) {
  be_.copy_from_host(params_.data(), host, params_.bytes());
}

void Model::store_params(float* host) const {
  be_.copy_to_host(host, params_.data(), params_.bytes());
}

std::vector<std::size_t> layer_sizes(const ModelSpec& spec, std::size_t offset, std::size_t length) {
  std::vector<std::size_t> out;
  std::size_t lo = 0;
  for (const auto& l : build_layers(spec))
    for (std::size_t n : l->param_groups()) {
      const std::size_t hi = lo + n;
      const std::size_t a = std::max(lo, offset), b = std::min(hi, offset + length);
      if (a < b) out.push_back(b - a);
      lo = hi;
    }
  return out;
}

std::vector<ParamInfo> Model::param_info() const {
  std::vector<ParamInfo> out;
  std::size_t off = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::size_t n = layers_[i]->num_params();
    if (n) out.push_back({std::to_string(i) + "." + layers_[i]->describe(), off, n});
    off += n;
  }
  return out;
}

std::string Model::describe() const {
  std::string s;
  for (const auto& l : layers_) s += (s.empty() ? "" : " -> ") + l->describe();
  return s + " (" + std::to_string(num_params()) + " parameters)";
}

const float* Model::forward(const float* x, int B, const ForwardMode& mode) {
  if (B > max_batch_)
    throw std::invalid_argument("Model: batch of " + std::to_string(B) +
                                " exceeds the max_batch " + std::to_string(max_batch_));
  const float* in = model_input(x, B);
  for (std::size_t i = 0; i < layers_.size(); ++i) in = forward_layer(i, in, B, mode);
  return in;
}

const float* Model::model_input(const float* x, int B) {
  if (relaid_input_.size() == 0) return x;
  be_.relayout_images(x, B, spec_.channels, spec_.height * spec_.width, be_.image_layout(), relaid_input_.data());
  return relaid_input_.data();
}

const float* Model::forward_layer(std::size_t i, const float* in, int B, const ForwardMode& mode) {
  layers_[i]->set_mode(mode);
  inputs_[i] = in;
  layers_[i]->forward(be_, in, acts_[i + 1].data(), B, scratch_[i].data());
  return acts_[i + 1].data();
}

const float* Model::backward_layer(std::size_t i, const float* dy, int B, std::size_t& end, GradListener* listener) {
  float* bufs[2] = {dping_.data(), dpong_.data()};
  float* dx = i == 0 ? nullptr : bufs[i % 2];
  end -= layers_[i]->num_params();
  const GradProgress progress{listener, end};
  layers_[i]->backward(be_, inputs_[i], acts_[i + 1].data(), dy, dx, B, scratch_[i].data(), progress);
  progress.ready_from(0);
  return dx;
}

std::vector<Model::PassTimes> Model::profile_passes(const float* x, const std::int32_t* labels, const float* targets,
                                                    int B, int reps) {
  if (B < 1 || B > max_batch_ || reps < 1)
    throw std::invalid_argument("Model::profile_passes: a batch of " + std::to_string(B) + " (max " +
                                std::to_string(max_batch_) + "), " + std::to_string(reps) + " repetitions");
  std::vector<PassTimes> t(layers_.size() + 1);
  for (std::size_t i = 0; i < layers_.size(); ++i) t[i].pass = std::to_string(i) + "." + layers_[i]->describe();
  t.back().pass = "loss";
  // ms += pass()'s share of the mean over steps 1..reps (step 0, untimed, makes plans).
  auto timed = [&](int step, double& ms, auto&& pass) {
    const double took = synchronized_ms(be_, pass);
    if (step > 0) ms += took / reps;
  };
  for (int step = 0; step <= reps; ++step) {
    const float* in = model_input(x, B);
    for (std::size_t i = 0; i < layers_.size(); ++i) timed(step, t[i].forward_ms, [&] { in = forward_layer(i, in, B, ForwardMode{}); });
    timed(step, t.back().forward_ms, [&] { loss(in, labels, targets, B, 1.0f / float(B)); });
    const float* dy = dout_.data();
    std::size_t end = num_params();
    for (std::size_t i = layers_.size(); i-- > 0;) timed(step, t[i].backward_ms, [&] { dy = backward_layer(i, dy, B, end, nullptr); });
  }
  return t;
}

double Model::loss(const float* out, const std::int32_t* labels, const float* targets, int B,
                   float grad_scale) {
  return spec_.loss == Loss::softmax_xent
             ? be_.softmax_xent(out, labels, B, spec_.outputs, grad_scale, dout_.data())
             : be_.mse(out, targets, B, spec_.outputs, grad_scale, dout_.data());
}

double Model::forward_backward(const float* x, const std::int32_t* labels, const float* targets,
                               int B, float grad_scale, GradListener* listener) {
  if (B == 0) {
    be_.fill(grads_ptr_, num_params(), 0.0f);
    if (listener) listener->ready(0);
    return 0.0;
  }
  queue_forward_backward(x, labels, targets, B, grad_scale, listener);
  // The loss is read after backward is queued: on a GPU it does not stall the step between
  // the two (Backend::take_loss waits for the loss alone).
  return be_.take_loss() / B;
}

void Model::queue_forward_backward(const float* x, const std::int32_t* labels, const float* targets, int B,
                                   float grad_scale, GradListener* listener) {
  if (B < 1) throw std::invalid_argument("Model::queue_forward_backward: a batch of " + std::to_string(B));
  const float* out = forward(x, B, ForwardMode{});
  const float scale = grad_scale < 0 ? 1.0f / float(B) : grad_scale;
  if (spec_.loss == Loss::softmax_xent) be_.softmax_xent_deferred(out, labels, B, spec_.outputs, scale, dout_.data());
  else be_.mse_deferred(out, targets, B, spec_.outputs, scale, dout_.data());
  const float* dy = dout_.data();
  std::size_t end = num_params();  // of layer i's slice in ∇θ
  for (std::size_t i = layers_.size(); i-- > 0;) dy = backward_layer(i, dy, B, end, listener);
}

EvalCounts Model::evaluate(const float* x, const std::int32_t* labels, const float* targets,
                           int B) {
  EvalCounts c;
  if (B == 0) return c;
  const float* out = forward(x, B, ForwardMode{false, 0.0f});
  c.loss_sum = loss(out, labels, targets, B, 0.0f);
  if (spec_.loss == Loss::softmax_xent) c.correct = be_.count_correct(out, labels, B, spec_.outputs);
  c.samples = B;
  return c;
}

}  // namespace pslab
