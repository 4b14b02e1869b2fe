// The CUDA plugin (kernels/cuda_plugin.h): a CPU process never loads the CUDA libraries; the
// first question about GPUs loads the plugin (with every symbol it needs bound: RTLD_NOW), and a
// plugin that cannot be found makes a GPU run fail naming where it was looked for. Each test runs
// in a process of its own (ctest), so the first one sees a process that never asked.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "backend.h"
#include "comm/collective.h"
#include "cuda_plugin.h"

namespace pslab {
namespace {

std::string mapped_files() {
  std::ifstream f("/proc/self/maps");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(CudaPlugin, ACpuProcessLoadsNoCudaLibrary) {
  auto be = make_cpu_backend(1);
  std::vector<float> a(64, 1.0f), b(64, 2.0f), c(64, 0.0f);
  be->gemm(Trans::no, Trans::no, 8, 8, 8, 1.0f, a.data(), 8, b.data(), 8, 0.0f, c.data(), 8);
  EXPECT_FLOAT_EQ(c[0], 16.0f);
  const std::string maps = mapped_files();
  for (const char* lib : {"libcudart", "libcublas", "libnccl", "libpslab_cuda"})
    EXPECT_EQ(maps.find(lib), std::string::npos) << lib << " is mapped in a process that asked for no GPU";
}

TEST(CudaPlugin, TheFirstQuestionAboutGpusLoadsItWhereCudaWasBuilt) {
  std::string why;
  const int gpus = cuda_device_count(&why);
#ifdef PSLAB_BUILT_WITH_CUDA
  // Loaded, every symbol bound; then whether there is a GPU is the CUDA runtime's answer.
  EXPECT_EQ(why.find("cannot be loaded"), std::string::npos) << why;
  EXPECT_TRUE(gpus > 0 || why.find("no CUDA GPU here") != std::string::npos) << why;
  EXPECT_NE(mapped_files().find("libpslab_cuda.so"), std::string::npos);
#else
  EXPECT_EQ(gpus, 0);
  EXPECT_NE(why.find("no CUDA backend"), std::string::npos) << why;
#endif
}

TEST(CudaPlugin, TheNcclCollectiveLoadsWhereNcclWasBuilt) {
  // (what make_nccl_collective looks up: a binary that has it binds the plugin to its Collective)
  std::string why;
  void* make = cuda_plugin_symbol("libpslab_nccl.so", "pslab_nccl_collective", &why);
  if (nccl_built()) {
    EXPECT_NE(make, nullptr) << why;
    EXPECT_NE(mapped_files().find("libpslab_nccl.so"), std::string::npos);
  } else {
    EXPECT_EQ(make, nullptr);
    EXPECT_FALSE(why.empty());
  }
}

#if defined(PSLAB_BUILT_WITH_CUDA) && defined(PSLAB_WORKER_BIN)
// What a worker asked for a GPU says, its plugins looked for in `dir` ($PSLAB_CUDA_PLUGIN_DIR);
// its exit status into *status.
std::string cuda_worker_with_plugins_in(const std::string& dir, int* status) {
  const std::string cmd = "PSLAB_CUDA_PLUGIN_DIR=" + dir + " " PSLAB_WORKER_BIN
                          " allreduce -c " PSLAB_SOURCE_DIR "/experiments/configs/tiny.toml --set train.device=cuda"
                          " --rank 0 --coordinator tcp://127.0.0.1:1 --snapshots tcp://127.0.0.1:1 -o /nonexistent-out 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  *status = pclose(p);
  return out;
}

TEST(CudaPlugin, AGpuRunWithoutThePluginFailsNamingWhereItLooked) {
  // A worker asked for a GPU, its plugin pointed at a path with nothing there.
  int status = 0;
  const std::string out = cuda_worker_with_plugins_in("/nonexistent", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("/nonexistent/libpslab_cuda.so: not there"), std::string::npos) << out;
  EXPECT_NE(out.find("PSLAB_CUDA_PLUGIN_DIR"), std::string::npos) << out;
}

TEST(CudaPlugin, APluginOfAnotherBuildIsRefusedNamingWhy) {
  // A worker asked for a GPU, its plugin pointed at one built against another interface.
  if (access(PSLAB_STALE_PLUGIN_DIR "/libpslab_cuda.so", F_OK) != 0)
    GTEST_SKIP() << "no stale plugin at " PSLAB_STALE_PLUGIN_DIR " (a test binary moved from its build)";
  int status = 0;
  const std::string out = cuda_worker_with_plugins_in(PSLAB_STALE_PLUGIN_DIR, &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("libpslab_cuda.so: built by another pslab (plugin interface " + std::to_string(kPluginInterface - 1)),
            std::string::npos) << out;
  EXPECT_NE(out.find("rebuild it"), std::string::npos) << out;
}
#endif

}  // namespace
}  // namespace pslab
