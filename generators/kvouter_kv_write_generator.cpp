// kvouter_kv_write: writes rows of K or V into a device-resident page pool in place (the device
// cache's page writes and token appends, runtime/include/kvouter/device_cache.h). Row i, the
// Hkv x D values of one position, lands at (row_page[i], row_slot[i]). Every other element of the
// pool keeps its contents: the pure definition is undef, the rows are scattered by an update.
//
// Elements are moved as their bits (uint32 or uint16), so one kernel per element size serves
// float32, float16 and bfloat16 pools. Page and slot ids are checked on the host before the call
// (DeviceKvCache); here they are clamped into the pool, so that no id reaches memory outside it.
#include <Halide.h>

namespace kvouter::pipeline {
namespace {

using namespace Halide;

class KvouterKvWrite : public Generator<KvouterKvWrite> {
 public:
  GeneratorParam<int> bits{"bits", 32};  // element size: 32 (float32) or 16 (float16, bfloat16)

  Input<Buffer<void, 3>> rows{"rows"};                 // (d, h, row)
  Input<Buffer<int32_t, 1>> row_page{"row_page"};      // (row)
  Input<Buffer<int32_t, 1>> row_slot{"row_slot"};      // (row)
  Output<Buffer<void, 4>> pool{"pool"};                // (d, slot, h, page)

  void configure() {
    if (int(bits) != 32 && int(bits) != 16) throw CompileError("kvouter_kv_write: bits must be 32 or 16");
    rows.set_type(UInt(bits));
    pool.set_type(UInt(bits));
  }

  void generate() {
    Var d("d"), s("s"), h("h"), p("p");
    constexpr int kLanes = 32;  // threads along D: a constant extent on every GPU target
    pool(d, s, h, p) = undef(UInt(bits));
    Expr D = rows.dim(0).extent();
    RDom r(0, kLanes, 0, (D + kLanes - 1) / kLanes, 0, rows.dim(1).extent(), 0, rows.dim(2).extent(), "r");
    // dd < D by the predicate; the min keeps bounds inference (which ignores it) inside D.
    Expr dd = min(r[0] + r[1] * kLanes, D - 1);
    r.where(r[0] + r[1] * kLanes < D);
    Expr page = clamp(row_page(r[3]), pool.dim(3).min(), pool.dim(3).max());
    Expr slot = clamp(row_slot(r[3]), pool.dim(1).min(), pool.dim(1).max());
    pool(dd, slot, r[2], page) = rows(dd, r[2], r[3]);

    rows.dim(0).set_stride(1);
    pool.dim(0).set_stride(1);
    rows.set_estimates({{0, 128}, {0, 4}, {0, 128}});
    row_page.set_estimates({{0, 128}});
    row_slot.set_estimates({{0, 128}});
    pool.set_estimates({{0, 128}, {0, 64}, {0, 4}, {0, 1024}});

    // Rows never share an element (the host writes each position once per call), so the
    // scatter may run in parallel.
    const Target t = get_target();
    if (t.has_gpu_feature()) {
      // The pure (undef) stage on the device too: no host access, so the pool needs no host memory.
      pool.gpu_blocks(p);
      // Rows along x: the only grid dimension past 65535 workgroups on CUDA and NVIDIA's Vulkan
      // (DeviceKvCache writes at most kMaxRowsPerCall rows a call, within every device's limits).
      pool.update().allow_race_conditions().gpu_blocks(r[3], r[2]).gpu_threads(r[0]);
    } else {
      pool.update().allow_race_conditions().parallel(r[3]);
    }
  }
};

}  // namespace
}  // namespace kvouter::pipeline

HALIDE_REGISTER_GENERATOR(kvouter::pipeline::KvouterKvWrite, kvouter_kv_write)
