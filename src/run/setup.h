// From a config to the things a process builds: the model spec, the data, step counts.
// Every process of a run derives these the same way, so they agree without talking.
#pragma once

#include "run/config.h"
#include "core/data.h"
#include "core/model.h"

namespace pslab {

// Input shape and outputs follow the data kind (Fashion-MNIST: 1x28x28, 10 classes;
// synthetic: data.dim features, data.outputs outputs), so the server can size θ without
// loading any data.
ModelSpec model_spec(const ExperimentConfig& c);
DataSplit load_data(const ExperimentConfig& c);

// Steps every worker runs: train.steps if > 0, else ceil(epochs * steps per epoch).
long total_steps(const ExperimentConfig& c, long steps_per_epoch);
// Training samples in the data set the config names (without loading Fashion-MNIST: 60000).
std::size_t train_set_size(const ExperimentConfig& c);
// BLAS threads for a process: train.threads, or the host's cores / processes_on_host.
int blas_threads(const ExperimentConfig& c, int processes_on_host);
// The schedule with its length (total_epochs) set from the run.
ScheduleConfig schedule_for_run(const ExperimentConfig& c);

}  // namespace pslab
