#include "roles.h"

#include "run/setup.h"

namespace pslab {

std::unique_ptr<Backend> make_role_backend(const ExperimentConfig& cfg, const RoleOptions& opt) {
  return make_backend(cfg.train.device == "cuda" ? Device::cuda : Device::cpu, blas_threads(cfg, opt.procs_on_host),
                      opt.gpu_slot);
}

}  // namespace pslab
