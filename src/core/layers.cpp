#include "core/layers.h"

namespace pslab {

void init_uniform(float* w, std::size_t n, double limit, Rng& rng) {
  for (std::size_t i = 0; i < n; ++i) w[i] = float(rng.uniform(-limit, limit));
}

// ---- Residual ---------------------------------------------------------------------------------

// The scratch of a batch of B: per sub-layer (all()'s order) its output (B, out) and its own
// scratch; then the gradient of the sum (B, out) and two buffers (B, widest) that the paths'
// input gradients alternate between.
struct Residual::Layout {
  std::vector<float*> out, scratch;
  float* dsum;
  float* grad[2];
};

namespace {
const std::vector<std::unique_ptr<Layer>>& nonempty(const std::vector<std::unique_ptr<Layer>>& main) {
  if (main.empty()) throw std::invalid_argument("residual: the main path has no layers");
  return main;
}
}  // namespace

Residual::Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut)
    : Layer(nonempty(main).front()->in(), main.back()->out()), main_(std::move(main)), shortcut_(std::move(shortcut)) {
  const Shape end = shortcut_.empty() ? in() : shortcut_.back()->out();
  if (end.size() != out().size())
    throw std::invalid_argument("residual: the shortcut gives " + std::to_string(end.size()) + " values per sample, the main path " +
                                std::to_string(out().size()));
  for (const auto& l : main_) all_.push_back(l.get());
  for (const auto& l : shortcut_) all_.push_back(l.get());
  layout_ = std::make_unique<Layout>();
  layout_->out.resize(all_.size()), layout_->scratch.resize(all_.size());
}

Residual::~Residual() = default;

const std::vector<Layer*>& Residual::all() const {
  return all_;
}

std::string Residual::describe() const {
  auto chain = [](const std::vector<std::unique_ptr<Layer>>& ls) {
    std::string s;
    for (const auto& l : ls) s += (s.empty() ? "" : " -> ") + l->describe();
    return s;
  };
  return "residual[" + chain(main_) + " | " + (shortcut_.empty() ? std::string("identity") : chain(shortcut_)) + "]";
}

std::size_t Residual::num_params() const {
  std::size_t n = 0;
  for (Layer* l : all()) n += l->num_params();
  return n;
}

void Residual::init_params(float* w, Rng& rng) const {
  for (Layer* l : all()) l->init_params(w, rng), w += l->num_params();
}

void Residual::bind(float* w, float* g) {
  for (Layer* l : all()) l->bind(w, g), w += l->num_params(), g += l->num_params();
}

std::size_t Residual::state_floats() const {
  std::size_t n = 0;
  for (Layer* l : all()) n += l->state_floats();
  return n;
}

void Residual::init_state(float* s) const {
  for (Layer* l : all()) l->init_state(s), s += l->state_floats();
}

void Residual::bind_state(float* s) {
  for (Layer* l : all()) l->bind_state(s), s += l->state_floats();
}

void Residual::set_mode(const ForwardMode& m) {
  for (Layer* l : all()) l->set_mode(m);
}

std::vector<std::size_t> Residual::param_groups() const {
  std::vector<std::size_t> v;
  for (Layer* l : all())
    for (std::size_t n : l->param_groups()) v.push_back(n);
  return v;
}

namespace {
std::size_t widest(const std::vector<Layer*>& layers) {
  std::size_t w = 0;
  for (Layer* l : layers) w = std::max({w, std::size_t(l->in().size()), std::size_t(l->out().size())});
  return w;
}
}  // namespace

std::size_t Residual::scratch_floats(Backend& be, int batch) const {
  std::size_t n = 0;
  for (Layer* l : all()) n += std::size_t(batch) * l->out().size() + l->scratch_floats(be, batch);
  return n + std::size_t(batch) * (out().size() + 2 * widest(all()));
}

const Residual::Layout& Residual::layout(Backend& be, float* p, int B) {
  Layout& L = *layout_;
  for (std::size_t k = 0; k < all_.size(); ++k) {
    L.out[k] = p, p += std::size_t(B) * all_[k]->out().size();
    L.scratch[k] = p, p += all_[k]->scratch_floats(be, B);
  }
  L.dsum = p, p += std::size_t(B) * out().size();
  const std::size_t w = std::size_t(B) * widest(all());
  L.grad[0] = p, L.grad[1] = p + w;
  return L;
}

void Residual::forward(Backend& be, const float* x, float* y, int B, float* scratch) {
  const Layout& L = layout(be, scratch, B);
  const std::vector<Layer*>& layers = all();
  const float* path_out[2] = {x, x};  // main's output, the shortcut's
  for (std::size_t k = 0; k < layers.size(); ++k) {
    const bool first_of_path = k == 0 || k == main_.size();
    const float* in = first_of_path ? x : L.out[k - 1];
    layers[k]->forward(be, in, L.out[k], B, L.scratch[k]);
    path_out[k < main_.size() ? 0 : 1] = L.out[k];
  }
  const std::size_t n = std::size_t(B) * out().size();
  be.copy(y, path_out[0], n * sizeof(float));
  be.axpy(n, 1.0f, path_out[1], y);
  be.relu_forward(y, y, n);
}

void Residual::backward(Backend& be, const float* x, const float* y, const float* dy, float* dx, int B,
                        float* scratch, const GradProgress&) {
  const Layout& L = layout(be, scratch, B);
  const std::vector<Layer*>& layers = all();
  const std::size_t n = std::size_t(B) * out().size();
  be.relu_backward(dy, y, L.dsum, n);
  // Layers [lo, hi) of all(), back from the sum's gradient; the path's input gradient into `last`.
  auto path_backward = [&](std::size_t lo, std::size_t hi, float* last) {
    const float* d = L.dsum;
    for (std::size_t k = hi; k-- > lo;) {
      float* dk = k == lo ? last : L.grad[(k - lo) % 2];
      layers[k]->backward(be, k == lo ? x : L.out[k - 1], L.out[k], d, dk, B, L.scratch[k], GradProgress{});
      d = dk;
    }
  };
  path_backward(0, main_.size(), dx);
  if (shortcut_.empty()) {
    if (dx) be.axpy(std::size_t(B) * in().size(), 1.0f, L.dsum, dx);
    return;
  }
  // grad[0] is free for the shortcut's input gradient: its first layer reads grad[1] or dsum.
  path_backward(main_.size(), layers.size(), dx ? L.grad[0] : nullptr);
  if (dx) be.axpy(std::size_t(B) * in().size(), 1.0f, L.grad[0], dx);
}

}  // namespace pslab
