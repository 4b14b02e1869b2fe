// The CPU backend's oneDNN convolutions (kernels/cpu/onednn_conv.h), where pslab is built with
// oneDNN: every convolution shape of the built-in models runs on it, on NHWC images with no
// scratch, a second pass gives bitwise the first, and the backend says which path it takes.
// Their values against a direct convolution: CpuConvolution.* in test_kernels.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "backend.h"
#include "cpu/onednn_conv.h"

namespace pslab {
namespace {

TEST(OnednnConvolutions, RunsEveryShapeOfTheBuiltInModels) {
  OnednnConvolutions conv;
  // ResNet on 28x28 and 32x32 (first, 3x3, stride-2 3x3, 1x1 shortcut), the small CNN's 5x5.
  for (auto [g, OC] : {std::pair{math::ConvGeometry{1, 28, 28, 3, 3, 1, 1}, 16}, {math::ConvGeometry{3, 32, 32, 3, 3, 1, 1}, 16},
                       {math::ConvGeometry{16, 28, 28, 3, 3, 1, 1}, 16}, {math::ConvGeometry{16, 28, 28, 3, 3, 2, 1}, 32},
                       {math::ConvGeometry{16, 28, 28, 1, 1, 2, 0}, 32}, {math::ConvGeometry{64, 7, 7, 3, 3, 1, 1}, 64},
                       {math::ConvGeometry{1, 28, 28, 5, 5, 1, 2}, 8}, {math::ConvGeometry{8, 14, 14, 5, 5, 1, 2}, 16}})
    for (const int threads : {1, 2})
      EXPECT_TRUE(conv.ready(g, OC, 64, threads)) << "C " << g.C << " " << g.H << "x" << g.W << " k" << g.KH << " s" << g.stride
                                                  << " -> " << OC << ", " << threads << " thread(s)";
  EXPECT_FALSE(conv.ready(math::ConvGeometry{16, 28, 28, 3, 3, 1, 1}, 16, 0, 1)) << "an empty batch is not oneDNN's";
}

TEST(OnednnConvolutions, ALayerNeedsNoScratchItsImagesAreNhwc) {
  // The backend on oneDNN holds images in NHWC, what oneDNN's kernels run on: a convolution
  // needs neither columns (im2col's: 128 MB for a ResNet evaluator's batch of 256 at 28 x 28)
  // nor reordered copies.
  auto be = make_cpu_backend(1);
  const math::ConvGeometry g{16, 28, 28, 3, 3, 1, 1};
  EXPECT_EQ(be->image_layout(), ImageLayout::nhwc);
  EXPECT_EQ(be->conv_scratch_floats(g, 16, 256), 0u);
  EXPECT_EQ(Backend::im2col_scratch_floats(g, 16, 256), std::size_t(256) * 784 * (144 + 16));
  auto im2col = make_cpu_backend(1, CpuConvolutions::im2col);
  EXPECT_EQ(im2col->image_layout(), ImageLayout::nchw);
  EXPECT_EQ(im2col->conv_scratch_floats(g, 16, 256), Backend::im2col_scratch_floats(g, 16, 256));
}

TEST(OnednnConvolutions, APassIsDeterministicAndTheBackendSaysItRunsOnOnednn) {
  // (use_best_cpu_runtime, first in this test binary's main, re-executed it with the policy set)
  ASSERT_NE(std::getenv("OMP_WAIT_POLICY"), nullptr) << "oneDNN's threads would spin between convolutions";
  auto be = make_cpu_backend(2);
  EXPECT_NE(be->describe().find("convolutions on oneDNN"), std::string::npos) << be->describe();
  EXPECT_NE(make_cpu_backend(2, CpuConvolutions::im2col)->describe().find("convolutions by im2col"), std::string::npos);
  const math::ConvGeometry g{16, 14, 14, 3, 3, 1, 1};
  const int OC = 32, B = 8, N = 14 * 14;
  std::vector<float> x(std::size_t(B) * 16 * N), W(std::size_t(OC) * 16 * 9), dy(std::size_t(B) * OC * N);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  for (std::size_t i = 0; i < W.size(); ++i) W[i] = std::cos(0.11f * float(i));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = std::sin(0.05f * float(i) + 1.0f);
  std::vector<float> y[2], dW[2], dx[2];
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float> scratch(be->conv_scratch_floats(g, OC, B), std::nanf(""));
    y[pass].assign(dy.size(), 0.0f), dW[pass].assign(W.size(), 0.0f), dx[pass].assign(x.size(), 0.0f);
    be->conv_forward(x.data(), W.data(), g, OC, B, y[pass].data(), scratch.data());
    be->conv_backward(x.data(), W.data(), dy.data(), g, OC, B, dW[pass].data(), dx[pass].data(), scratch.data());
  }
  EXPECT_EQ(y[0], y[1]);
  EXPECT_EQ(dW[0], dW[1]);
  EXPECT_EQ(dx[0], dx[1]);
  set_cpu_backend_threads(1);
}

}  // namespace
}  // namespace pslab
