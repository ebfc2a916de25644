// The toolchain end to end: a small Halide pipeline (a gather, like the forward's paged reads)
// JIT-compiled for host and for host-vulkan, run on whatever Vulkan device the loader offers
// (lavapipe in CI), under the validation layer. Halide 21.0.0's Vulkan allocator corrupts buffers
// whose byte size is not a multiple of 64, so the odd-sized case pads its buffers first: the
// regression test of that defence.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <Halide.h>

#include "vulkan_required.h"

namespace {

using namespace Halide;

// out(x, y) = in(x, idx(y)) * 2 + y, over an in of W x H and an idx of Hout rows.
Func gather_pipeline(ImageParam& in, ImageParam& idx, bool gpu) {
  Var x("x"), y("y"), xo("xo"), yo("yo"), xi("xi"), yi("yi");
  Func out("out");
  out(x, y) = in(x, clamp(idx(y), 0, in.height() - 1)) * 2.f + cast<float>(y);
  if (gpu) {
    out.gpu_tile(x, y, xo, yo, xi, yi, 16, 8, TailStrategy::GuardWithIf);
  } else {
    out.vectorize(x, 8, TailStrategy::GuardWithIf).parallel(y);
  }
  return out;
}

// Halide's Vulkan runtime aborts the process when no device exists: ask in a child first.
bool vulkan_usable(const Target& t) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) _exit(host_supports_target_device(t) ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Runs the pipeline with logical sizes (W, Hout) on whole buffers whose rows are padded to pad_w
// floats and whose row counts are padded to multiples of 16 (every byte size then a multiple of
// 64), and checks the logical region. Crops are not used: Halide sizes a crop's device buffer by
// the crop, which reintroduces odd sizes (the validation layer reports it).
void run_and_check(const Target& t, bool gpu, int W, int H, int Hout, int pad_w) {
  ImageParam in(Float(32), 2, "in"), idx(Int(32), 1, "idx");
  Func out = gather_pipeline(in, idx, gpu);
  const int idx_pad = (Hout + 15) / 16 * 16;
  Buffer<float> bin(pad_w, (H + 15) / 16 * 16), bout(pad_w, idx_pad);
  Buffer<int32_t> bidx(idx_pad);
  bin.fill(0.f);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < pad_w; ++x) bin(x, y) = static_cast<float>(x + 1000 * y);
  for (int y = 0; y < idx_pad; ++y) bidx(y) = (y * 7 + 3) % H;
  in.set(bin);
  idx.set(bidx);
  out.realize(bout, t);
  bout.copy_to_host();
  Buffer<float>& view = bout;
  for (int y = 0; y < Hout; ++y) {
    for (int x = 0; x < W; ++x) {
      ASSERT_EQ(view(x, y), bin(x, bidx(y)) * 2.f + y) << "at " << x << "," << y << " on " << t.to_string();
    }
  }
}

TEST(HalideSmoke, HostJit) { run_and_check(get_host_target(), false, 37, 50, 29, 37); }

TEST(HalideSmoke, VulkanJitPaddedBuffers) {
  const Target t = get_host_target().with_feature(Target::Vulkan);
  if (!vulkan_usable(t)) KVOUTER_NO_VULKAN("no Vulkan device available to Halide (" << t.to_string() << ")");
  run_and_check(t, true, 256, 64, 48, 256);  // every byte size a multiple of 64
  run_and_check(t, true, 37, 50, 29, 48);    // odd logical width 37, rows padded to 48 floats
}

}  // namespace
