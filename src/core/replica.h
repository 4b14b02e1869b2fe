// One model replica and the data it trains on: the compute part of every worker, whatever
// the consistency mode. The data sets live where the backend computes: on the CPU their own
// host arrays; on a GPU a copy uploaded once, on first use. A step's batch is gathered there
// from its sample indices (Backend::gather_rows; on a GPU only the indices cross, once per
// epoch where the replica follows its sampler: follow()), into
// preallocated buffers: no allocation per step. A data set that does not fit on the GPU is
// gathered on the host and its batches uploaded instead.
//
// θ and ∇θ travel (push, pull, snapshots) as host buffers: on the CPU the model's own; on a
// GPU page-locked host staging copies, allocated once, that upload_params() and download_*()
// move.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend.h"
#include "core/data.h"
#include "core/model.h"
#include "core/optimizer.h"

namespace pslab {

class ShardSampler;

// train.cuda_graphs: whether a step's forward and backward run as one recorded graph.
enum class StepGraphs { off, automatic, on };
// "off", "auto" or "on"; throws std::invalid_argument naming the key otherwise.
StepGraphs step_graphs_from(const std::string& value);

class Replica {
 public:
  // `train` must outlive the replica. max_batch covers both training and evaluation batches.
  // grad_host (P floats, optional, must outlive the replica): where ∇θ leaves for the network,
  // e.g. memory the transport sends from without a copy: on the CPU the model's ∇θ itself, on
  // a GPU the buffer download_grads() copies into.
  // On a GPU grad_host is registered with the backend (Backend::register_host) while the
  // replica lives, so that ∇θ's copies into it run on the copy engine.
  Replica(Backend& be, const ModelSpec& spec, const Dataset& train, int max_batch, float* grad_host = nullptr);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  Model& model() { return model_; }
  Backend& backend() { return be_; }

  // Forward and backward on the training samples `idx`; ∇θ holds the gradient of their mean
  // loss afterwards (of grad_scale x their summed loss, if grad_scale >= 0). Returns the mean
  // loss (0 for an empty batch, with ∇θ = 0). `listener` hears which tail of ∇θ is final as
  // backward goes (Model::forward_backward).
  double compute_gradient(std::span<const std::uint32_t> idx, float grad_scale = -1.0f,
                          GradListener* listener = nullptr);
  // A training step where this replica owns θ: compute_gradient(idx), then (for a non-empty
  // batch) opt's update of θ by ∇θ at learning rate lr; returns the mean loss. opt covers all of
  // θ. Under step graphs with an optimizer whose update records (Optimizer::records), the update
  // is part of the step's graph: the optimizer is given live scalars (Optimizer::use_live_scalars)
  // and its scalars are written before each replay; otherwise the update runs after the graph.
  double train_step(std::span<const std::uint32_t> idx, Optimizer& opt, double lr);
  // From now on the training batches are augmented (data.augment: crop with `pad` zeros and
  // flip; math::augment_draw), each sample's draw from (seed, the epoch set_epoch() last said,
  // the sample), on either backend alike. Needs image data (height and width > 1).
  void augment(std::uint64_t seed, int pad);
  // Where a train_step's time goes (bench_train --profile): the batch's gather, each pass of the
  // model (Model::profile_passes) and opt's update at lr, each timed apart with the backend
  // synchronized around it, averaged over `reps` after one untimed round; gather and update
  // as rows of their own (forward_ms their time). Without augmentation or step graphs.
  std::vector<Model::PassTimes> profile_step(std::span<const std::uint32_t> idx, Optimizer& opt, double lr, int reps);
  // Steps as graphs (Backend::begin_recording; train.cuda_graphs). The first step of a shape (its
  // batch size, scale, buffers and whether an optimizer's update ends it) runs as usual and sizes what a recording needs; the second of
  // it in a row is recorded (forward, backward and the deferred loss) and replayed, and so is every
  // later one of that shape; once a shape has its graph, a step of another shape (an epoch's last,
  // smaller batch) runs as usual. A graph that a backend refuses to replay (a buffer it used moved)
  // is dropped: that step runs as usual and the next one of its shape is recorded again. A
  // listener hears ready(0) after the replay: the gradient's download does not overlap backward.
  // automatic: graphs where the backend records them, except for a listened step whose ∇θ is
  // over kGraphsBeforeOverlapBytes (there overlapping the download with backward weighs more
  // than the launches a graph saves); a step that cannot be recorded says why once and runs
  // without graphs from then on. on: graphs for every step of a recorded shape, listened or not;
  // a backend without graphs (the CPU) is refused here, a step that cannot be recorded throws.
  void use_step_graphs(StepGraphs s);
  static constexpr std::size_t kGraphsBeforeOverlapBytes = std::size_t(4) << 20;
  // What use_step_graphs() left in force (off on a backend without graphs, or after a step that
  // could not be recorded under automatic).
  StepGraphs step_graphs() const { return graphs_; }
  // Steps replayed from a graph so far, and recordings made.
  long graphed_steps() const { return graphed_steps_; }
  long recordings() const { return recordings_; }
  void set_epoch(long epoch) { epoch_ = epoch; }
  // Batches that are views into `sampler`'s shard (ShardSampler::batch) find their indices on
  // the GPU: the epoch's shard crosses once, at its first batch (as a device-side permutation
  // would), instead of each batch's indices every step, a copy that waits for the step before
  // it. Other batches' indices cross as before. `sampler` must outlive the replica's steps.
  // No-op on the CPU.
  void follow(const ShardSampler& sampler);
  // Loss and accuracy of the current θ on a whole data set, in batches of max_batch, in
  // inference mode; a model with batch norm first measures its statistics for this θ
  // (measure_statistics()).
  EvalCounts evaluate(const Dataset& d);
  // Batch norm's running statistics measured afresh for the current θ: the plain average over
  // kStatisticsSamples training samples (un-augmented) in batches of up to 256, the same samples
  // for every θ, worker and mode. (Training keeps each replica's own running statistics, which
  // never leave it; an evaluated θ comes from the servers or a collective, so its statistics are
  // measured where it is evaluated.) No-op for models without batch norm.
  void measure_statistics();
  static constexpr int kStatisticsSamples = 5120, kStatisticsBatch = 256;

  // θ as a host buffer of P floats (write it, then upload_params()).
  float* host_params();
  // host_params() -> the model's θ (no-op on the CPU).
  void upload_params();
  // The model's θ -> host_params(), which it returns (no-op on the CPU).
  const float* download_params();
  // The model's ∇θ -> a host buffer of P floats, which it returns (no-op on the CPU).
  const float* download_grads();
  // That host buffer, not written: where ∇θ lands piece by piece on a GPU (worker/grad_stager.h);
  // on the CPU the model's ∇θ itself.
  float* host_grads();
  // host_params()[lo, lo + n) -> the model's θ, queued beside the compute (Backend::upload_async;
  // no-op on the CPU): θ goes back to the GPU piece by piece as a pull reply's pieces land.
  // params_fence(): the next forward waits for every such copy (on the device).
  void upload_params_async(std::size_t lo, std::size_t n);
  void params_fence();
  // Waits until every upload_params_async() copy has landed (upload_params() and
  // download_params() do first: they copy all of θ through the same host buffer).
  void params_landed();

 private:
  struct Batch { const float* x; const std::int32_t* labels; const float* targets; };
  // A data set on the backend's device: x (n, features), labels (n) or targets (n, target_dim).
  struct Resident {
    const float* x = nullptr;
    const std::int32_t* labels = nullptr;
    const float* targets = nullptr;
    DeviceBuffer<float> x_buf, t_buf;  // GPU: the uploaded copy
    DeviceBuffer<std::int32_t> y_buf;
  };
  // `d` on the device (uploaded on first use), or nullptr if it does not fit there.
  const Resident* resident(const Dataset& d);
  // The samples `idx` of `d` gathered into the batch buffers; device pointers.
  Batch stage(const Dataset& d, std::span<const std::uint32_t> idx);
  // (GPU) idx on the device, queued: inside the followed shard where idx views it, else this
  // batch's own copy in one of two slots.
  const std::uint32_t* device_indices(std::span<const std::uint32_t> idx);
  void upload_shard(std::span<const std::uint32_t> shard);
  // Samples [lo, lo + n) of `d`: pointers into the resident copy, or staged.
  Batch slice(const Dataset& d, int lo, int n);
  // What a step graph was recorded for: a replay reads the same buffers, for the same batch.
  struct StepShape {
    const float* x = nullptr;
    const std::int32_t* labels = nullptr;
    const float* targets = nullptr;
    int batch = 0;
    float grad_scale = 0.0f;
    std::uint64_t update = 0;  // the Optimizer::identity() whose update ends the step (0: none)
    bool operator==(const StepShape&) const = default;
  };
  // compute_gradient(), then update's update of θ (live scalars, begun) where update is given.
  double step(std::span<const std::uint32_t> idx, float grad_scale, GradListener* listener, Optimizer* update);
  // The step's forward, backward (and update) from a graph (recorded now if this shape was seen
  // before): the mean loss, or nothing where it runs the ordinary way.
  std::optional<double> graphed_step(const Batch& b, int B, float grad_scale, bool listened, Optimizer* update);
  // Records the step's work as graph_; false (graphs off from now on, said once) where it cannot be.
  bool record_step(const Batch& b, int B, float grad_scale, Optimizer* update);

  Backend& be_;
  const Dataset& train_;
  Model model_;
  int max_batch_;
  Resident cpu_view_;  // CPU: points into the data set asked for last
  struct Upload {        // GPU: a data set's copy (copy == nullptr: it did not fit)
    const Dataset* set;
    const float* x;
    int n;
    std::unique_ptr<Resident> copy;
  };
  std::vector<Upload> uploaded_;  // the training set, the test set
  // Host memory is the backend's (page-locked on a GPU: each copy one DMA, no staging).
  HostBuffer<float> x_host_, t_host_;  // GPU fallback staging; CPU: the batch buffers
  HostBuffer<std::int32_t> y_host_;
  DeviceBuffer<float> x_dev_, t_dev_;  // GPU: the batch buffers
  DeviceBuffer<std::int32_t> y_dev_;
  // GPU: a step's sample indices, through two page-locked slots in turn, each copied on the
  // copy lane (no host round trip per step; the slot is rewritten once its last copy landed).
  HostBuffer<std::uint32_t> idx_host_[2];
  DeviceBuffer<std::uint32_t> idx_dev_[2];
  Backend::Ticket idx_copied_[2] = {0, 0};
  int idx_slot_ = 0;
  std::vector<std::uint32_t> eval_idx_;
  // The followed sampler's shard on the device (follow()): the epoch it holds, its pinned copy
  // and that copy's last upload.
  const ShardSampler* sampler_ = nullptr;
  long shard_epoch_ = -1;
  HostBuffer<std::uint32_t> shard_host_;
  DeviceBuffer<std::uint32_t> shard_dev_;
  Backend::Ticket shard_copied_ = 0;
  const std::uint32_t* staged_idx_ = nullptr;  // the last stage()'s indices on the device (CPU: the caller's)
  // data.augment: the augmented batch; the batch's indices where stage() left none on the device
  bool augment_ = false;
  std::uint64_t augment_seed_ = 0;
  int augment_pad_ = 0;
  long epoch_ = 0;
  DeviceBuffer<float> augmented_;
  DeviceBuffer<std::uint32_t> augment_idx_;
  HostBuffer<float> theta_host_, grad_host_;  // GPU only: θ and ∇θ staging, allocated on first use
  Backend::Ticket params_uploaded_ = 0;        // GPU: the last upload_params_async() copy (0: all landed)
  float* grad_host_given_;                     // the caller's grad_host, or nullptr
  bool grad_host_registered_ = false;          // GPU: grad_host_given_ registered with the backend
  StepGraphs graphs_ = StepGraphs::off;
  StepShape warm_shape_, graph_shape_;     // the last step run as usual; what graph_ was recorded for
  std::unique_ptr<Backend::Graph> graph_;  // the step graph, once recorded
  long graphed_steps_ = 0, recordings_ = 0;
};

}  // namespace pslab
