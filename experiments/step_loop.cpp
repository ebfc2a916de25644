#include "step_loop.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "cli_util.h"
#include "direct.h"
#include "kvouter/device_cache.h"
#include "kvouter/errors.h"
#include "kvouter/host_copy.h"
#include "kvouter/stats.h"

namespace kvouter::experiments {

namespace {

using json = nlohmann::json;
using halide::DeviceKvCache;
using halide::DeviceStepRunner;

json summary(const std::vector<double>& v) {
  return {{"median", median(v)}, {"p10", quantile(v, 0.1)}, {"p90", quantile(v, 0.9)}, {"all", v}};
}

}  // namespace

json run_step_loop(const Inputs& case_in, const StepLoopOptions& opt, bool check_with_direct, const Outputs* reference) {
  Inputs st = case_in;  // the engine's host state (the oracle's copy of the pool, compact page ids)
  const int64_t P = st.k_pages.shape[0], H = st.k_pages.shape[1], PS = st.k_pages.shape[2], D = st.k_pages.shape[3];
  const int64_t B = st.cu_seqlens_q.numel() - 1, Tq = st.q.shape[0], Hq = st.q.shape[1];
  const int64_t maxp = st.block_tables.shape[1], topk = st.selected.shape[2], BS = st.block_size, ppb = BS / PS;
  const bool decode = Tq == B;
  const Dtype dt = st.dtype;
  // Cache page ids: the case's compact ids spread over the whole pool (full_pool), so that its
  // pages lie in every segment.
  const int64_t N = opt.full_pool ? std::max<int64_t>(st.block_tables.numel(), P) : P;
  const int64_t stride = std::max<int64_t>(N / std::max<int64_t>(P, 1), 1);
  auto cache_id = [&](int32_t c) { return c < 0 ? c : static_cast<int32_t>(c * stride); };

  json r = {{"target", opt.target}, {"schedule", opt.schedule}, {"dtype", dtype_name(dt)}, {"steps", opt.steps},
            {"pool_pages", N}, {"written_pages", P}, {"staging", !opt.in_place ? "copy" : !opt.q_ahead ? "in_place_after_plan" : !opt.outputs_in_place ? "in_place_read_back" : "in_place"},
            {"tables", opt.resident_tables ? "resident" : "host"}};
  if (opt.q_streaming && !opt.in_place) throw InputError("q_streaming", "a loop with in_place staging", "copy staging");
  if (opt.in_place) r["q_write"] = opt.q_streaming ? "streaming" : "memcpy";  // the engine's write of q into the staging
  if (opt.overlap_parts > 0) {
    if (!opt.in_place) throw InputError("overlap_parts", "a loop with in_place staging", "copy staging");
    r["staging"] = "overlapped";
    r["overlap_parts"] = opt.overlap_parts;
    if (opt.plan_probe) throw InputError("plan_probe", "steps run phase by phase (overlap_parts 0)", std::to_string(opt.overlap_parts) + " parts");
  }
  if (opt.resident_tables) {
    r["decode_plan_on_device"] = opt.decode_plan_on_device < 0 ? DeviceStepRunner::default_decode_plan_on_device(opt.target)
                                                               : opt.decode_plan_on_device == 1;
  }
  Stopwatch t0;
  DeviceKvCache cache(opt.target, {N, H, PS, D, dt});
  r["cache_setup_ms"] = t0.ms();  // allocation and clearing of both pools
  r["segments"] = cache.segments();
  r["segment_pages"] = cache.segment_pages();
  // The case's pages, written once, in calls of at most 1024 pages.
  t0.restart();
  const int64_t page_elems = H * PS * D, eb = dtype_bytes(dt);
  std::vector<int32_t> ids;
  for (int64_t p0 = 0; p0 < P; p0 += 1024) {
    const int64_t n = std::min<int64_t>(1024, P - p0);
    ids.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = cache_id(static_cast<int32_t>(p0 + i));
    const TensorView<const int32_t> idv(ids.data(), {n});
    if (dt == Dtype::kFloat32) {
      cache.write_pages(idv, StorageView(st.k_pages.data.data() + p0 * page_elems, {n, H, PS, D}),
                        StorageView(st.v_pages.data.data() + p0 * page_elems, {n, H, PS, D}));
    } else {
      cache.write_pages(idv, StorageView(st.k_bits.data.data() + p0 * page_elems, {n, H, PS, D}, dt),
                        StorageView(st.v_bits.data.data() + p0 * page_elems, {n, H, PS, D}, dt));
    }
  }
  const double write_ms = t0.ms();
  r["write_pages_ms"] = write_ms;
  r["write_pages_gbps"] = 2.0 * static_cast<double>(P * page_elems * eb) / write_ms / 1e6;

  std::vector<int32_t> tables(st.block_tables.data.size());
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = cache_id(st.block_tables.data[i]);
  if (!st.used_kv_lens) {
    st.used_kv_lens = Tensor<int32_t>({B});
    for (auto& l : st.used_kv_lens->data) l = static_cast<int32_t>(maxp * PS);
  }
  auto& lens = st.used_kv_lens->data;
  // Decode: the loop's appends fill the last `steps` positions of each sequence, which start
  // beyond L_b (SPEC masks them) and are written one per step.
  if (decode) {
    for (auto& l : lens) l = std::max<int32_t>(l - opt.steps, 1);
  }
  // Each sequence's blocks whose pages are held (the case keeps only reachable ones).
  std::vector<std::vector<int32_t>> held(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t blk = 0; blk * ppb < maxp; ++blk) {
      if (st.block_tables.data[static_cast<size_t>(b * maxp + blk * ppb)] >= 0) held[static_cast<size_t>(b)].push_back(static_cast<int32_t>(blk));
    }
  }
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto draw = [&](float* value, uint16_t* bits) {
    const float x = uni(rng);
    if (dt == Dtype::kFloat16) *value = half_to_float(*bits = float_to_half(x));
    else if (dt == Dtype::kBFloat16) *value = bf16_to_float(*bits = float_to_bf16(x));
    else *value = x;
  };
  // The engine's write of q into the runner's staging (outside the step).
  auto write_q = [&](void* dst, const void* src, int64_t bytes) {
    if (opt.q_streaming) {
      halide::host_copy_streaming(dst, src, bytes);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
    }
  };
  std::vector<int32_t> tok_page(static_cast<size_t>(B)), tok_slot(static_cast<size_t>(B));
  std::vector<float> tk(static_cast<size_t>(B * H * D)), tv(tk.size());
  std::vector<uint16_t> tk16(tk.size()), tv16(tk.size());

  DeviceStepRunner runner(cache, opt.schedule);
  if (opt.decode_plan_on_device >= 0) runner.set_decode_plan_on_device(opt.decode_plan_on_device == 1);
  runner.set_q_ahead(opt.q_ahead);
  if (!opt.outputs_in_place) runner.set_outputs_in_place(false);
  if (opt.overlap_parts > 0) runner.set_overlap_parts(opt.overlap_parts);
  if (opt.plan_tasks >= 0) runner.set_plan_tasks(opt.plan_tasks);
  std::vector<double> overlapped_ms, seq_total_ms;
  int parts_run = -1;                 // the overlapped steps' parts (-1: none ran)
  bool overlapped_equal = true;       // every overlapped step's outputs, bit for bit the sequential one's
  if (opt.resident_tables) {
    t0.restart();
    runner.write_block_tables(TensorView<const int32_t>(tables.data(), {B, maxp}));
    r["write_tables_ms"] = t0.ms();
  }
  Outputs out;
  auto direct = reference::make_direct_backend({"direct", "", {}, "host"});
  int64_t outputs_in_place = 0;
  std::vector<double> append_ms, plan_ms, device_plan_ms, validate_ms, build_ms, probe_ms, upload_ms, q_upload_ms, arrays_ms, fwd_ms, comb_ms, kernel_ms, read_ms, total_ms;
  json checks = json::array();
  for (int step = 0; step < opt.steps; ++step) {
    if (decode) {
      // One token per sequence, in place.
      for (int64_t b = 0; b < B; ++b) {
        const int32_t pos = lens[static_cast<size_t>(b)];
        const int32_t pg = st.block_tables.data[static_cast<size_t>(b * maxp + pos / PS)];
        tok_page[static_cast<size_t>(b)] = cache_id(pg);
        tok_slot[static_cast<size_t>(b)] = pos % static_cast<int32_t>(PS);
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t d = 0; d < D; ++d) {
            const size_t at = static_cast<size_t>((b * H + h) * D + d);
            const size_t to = static_cast<size_t>(((int64_t{pg} * H + h) * PS + pos % PS) * D + d);
            draw(&tk[at], &tk16[at]);
            draw(&tv[at], &tv16[at]);
            st.k_pages.data[to] = tk[at];
            st.v_pages.data[to] = tv[at];
            if (dt != Dtype::kFloat32) {
              st.k_bits.data[to] = tk16[at];
              st.v_bits.data[to] = tv16[at];
            }
          }
        }
        ++lens[static_cast<size_t>(b)];
      }
      // A new selection: the query's own block, block 0, then distinct random held blocks.
      for (int64_t b = 0; b < B; ++b) {
        const int32_t own = (lens[static_cast<size_t>(b)] - 1) / static_cast<int32_t>(BS);
        auto pool = held[static_cast<size_t>(b)];
        for (int64_t h = 0; h < H; ++h) {
          int32_t* row = &st.selected.data[static_cast<size_t>((b * H + h) * topk)];
          std::fill(row, row + topk, -1);
          std::shuffle(pool.begin(), pool.end(), rng);
          int64_t n = 0;
          row[n++] = own;
          if (own != 0 && n < topk) row[n++] = 0;
          for (int32_t blk : pool) {
            if (n >= topk) break;
            if (blk != own && blk != 0 && blk < own) row[n++] = blk;
          }
        }
      }
      for (size_t i = 0; i < st.q.data.size(); ++i) {
        uint16_t bits = 0;
        draw(&st.q.data[i], &bits);
        if (dt != Dtype::kFloat32) st.q_bits.data[i] = bits;
      }
      const Stopwatch a0;
      const TensorView<const int32_t> pv(tok_page.data(), {B}), sv(tok_slot.data(), {B});
      if (dt == Dtype::kFloat32) {
        cache.write_tokens(pv, sv, StorageView(tk.data(), {B, H, D}), StorageView(tv.data(), {B, H, D}));
      } else {
        cache.write_tokens(pv, sv, StorageView(tk16.data(), {B, H, D}, dt), StorageView(tv16.data(), {B, H, D}, dt));
      }
      append_ms.push_back(a0.ms());
    }
    halide::StepInputs s;
    s.q = dt == Dtype::kFloat32 ? StorageView(st.q.data.data(), {Tq, Hq, D}) : StorageView(st.q_bits.data.data(), {Tq, Hq, D}, dt);
    if (opt.in_place) {
      // The engine's q written where the runner uploads it from (here: the drawn values, copied
      // outside the step, standing for the engine producing them there).
      void* staged = runner.q_staging(Tq, Hq);
      write_q(staged, s.q.data, s.q.numel() * s.q.element_bytes());
      s.q.data = staged;
    }
    s.selected = TensorView<const int32_t>(st.selected.data.data(), {Tq, H, topk});
    if (opt.resident_tables) {
      s.resident_tables = true;  // written once above: the loop's appends use held pages only
    } else {
      s.block_tables = TensorView<const int32_t>(tables.data(), {B, maxp});
    }
    s.cu_seqlens_q = TensorView<const int64_t>(st.cu_seqlens_q.data.data(), {B + 1});
    s.used_kv_lens = TensorView<const int32_t>(lens.data(), {B});
    s.block_size = BS;
    s.causal = st.causal;
    s.softmax_scale = st.softmax_scale;
    // The engine checks the table entries where it writes them (appends use held pages only).
    halide::StepTiming ov;  // an overlapped step's timing
    if (opt.overlap_parts > 0) {
      const OutputsView v = runner.step_and_read(s, false);
      ov = runner.timing();
      if (step == 0) out = outputs_for(runner.plan().problem);
      std::copy(v.out.ptr(), v.out.ptr() + out.out.numel(), out.out.data.begin());
      std::copy(v.lse.ptr(), v.lse.ptr() + out.lse.numel(), out.lse.data.begin());
      overlapped_ms.push_back(ov.overlapped_ms);
      parts_run = step == 0 ? ov.overlap_parts : std::min(parts_run, ov.overlap_parts);
      // The same step again, phase by phase (q written into the staging again, as the engine
      // would): the kernels the overlapped step is measured against.
      const void* drawn = dt == Dtype::kFloat32 ? static_cast<const void*>(st.q.data.data()) : st.q_bits.data.data();
      write_q(runner.q_staging(Tq, Hq), drawn, s.q.numel() * s.q.element_bytes());
      runner.step(s, false);
      const OutputsView w = runner.read_outputs();
      overlapped_equal = overlapped_equal &&
                         std::memcmp(w.out.ptr(), out.out.data.data(), out.out.data.size() * sizeof(float)) == 0 &&
                         std::memcmp(w.lse.ptr(), out.lse.data.data(), out.lse.data.size() * sizeof(float)) == 0;
      seq_total_ms.push_back(runner.timing().total_ms());
    } else {
      if (opt.plan_probe) probe_ms.push_back(runner.host_plan(s, false).plan_ms);
      runner.step(s, false);
      if (step == 0) out = outputs_for(runner.plan().problem);
      if (opt.in_place) {
        const OutputsView v = runner.read_outputs();
        if (step == 0 || step + 1 == opt.steps) {  // the checked steps' outputs, outside the step
          std::copy(v.out.ptr(), v.out.ptr() + out.out.numel(), out.out.data.begin());
          std::copy(v.lse.ptr(), v.lse.ptr() + out.lse.numel(), out.lse.data.begin());
        }
      } else {
        runner.read_outputs(out);
      }
    }
    // The step's phases; an overlapped step's up to its plan's arrays and its total, the plan's
    // validation, q's upload, the kernels and the read-back of the same step phase by phase.
    const halide::StepTiming& t = runner.timing();
    const halide::StepTiming& head = opt.overlap_parts > 0 ? ov : t;
    plan_ms.push_back(head.plan_ms);
    device_plan_ms.push_back(head.device_plan_ms);
    upload_ms.push_back(head.upload_ms);
    arrays_ms.push_back(head.arrays_upload_ms);
    validate_ms.push_back(runner.plan().validate_ms);
    build_ms.push_back(runner.plan().plan_ms);
    q_upload_ms.push_back(t.q_upload_ms);
    fwd_ms.push_back(t.forward_ms);
    comb_ms.push_back(t.combine_ms);
    kernel_ms.push_back(t.forward_ms + t.combine_ms);
    read_ms.push_back(t.readback_ms);
    total_ms.push_back(head.total_ms());
    outputs_in_place += t.outputs_in_place ? 1 : 0;
    if ((check_with_direct || reference) && (step == 0 || step + 1 == opt.steps)) {
      ErrorReport e;
      if (check_with_direct) {
        const Plan dp = make_plan(st, direct->plan_options());
        const Outputs ref = direct->run(dp, st);
        e = compare_outputs(out, ref);
      } else {
        e = compare_outputs(out, *reference);
      }
      checks.push_back({{"step", step}, {"max_out_err", e.max_out_err}, {"max_lse_err", e.max_lse_err}, {"within_tolerance", e.ok()}});
    }
    if (step == 0 && opt.warmup_ms > 0) {
      const Stopwatch w;
      while (w.ms() < opt.warmup_ms) runner.launch();  // (the same kernels on step 0's arrays)
    }
  }
  r["warmup_ms"] = opt.warmup_ms;
  r["variant"] = runner.variant();
  r["tiles_on_device"] = runner.plan().tiles_on_device;
  if (!runner.plan().tiles_on_device) {  // (a plan built on the device counts nothing on the host)
    r["edges"] = runner.plan().edges;
    r["kv_bytes"] = runner.plan().kv_unit_bytes();
  }
  if (decode) r["append_ms"] = summary(append_ms);
  r["plan_ms"] = summary(plan_ms);
  r["upload_ms"] = summary(upload_ms);
  r["plan_validate_ms"] = summary(validate_ms);  // inside plan_ms
  r["plan_build_ms"] = summary(build_ms);  // inside plan_ms: the planner's own (validation and layout)
  r["plan_tasks"] = runner.plan_tasks();
  if (opt.plan_probe) r["plan_probe_ms"] = summary(probe_ms);  // before each step, outside it
  r["device_plan_ms"] = summary(device_plan_ms);  // inside plan_ms: the decode-plan kernel
  r["q_upload_ms"] = summary(q_upload_ms);  // CUDA: each alone, beside the plan
  r["arrays_upload_ms"] = summary(arrays_ms);
  r["outputs_in_place_steps"] = outputs_in_place;  // Vulkan: out/lse written by the combine into host memory
  r["forward_ms"] = summary(fwd_ms);
  r["combine_ms"] = summary(comb_ms);
  r["kernel_ms"] = summary(kernel_ms);
  r["readback_ms"] = summary(read_ms);
  r["step_ms"] = summary(total_ms);  // plan + uploads + kernels + readback
  if (opt.overlap_parts > 0) {
    // step_ms: the overlapped steps (plan + uploads + overlapped_ms); plan_validate_ms,
    // q_upload_ms and the phases from forward_ms on: the same steps run again phase by phase
    // (sequential_step_ms).
    r["overlapped_ms"] = summary(overlapped_ms);
    r["sequential_step_ms"] = summary(seq_total_ms);
    r["overlap_parts_run"] = parts_run;
    r["overlapped_equals_sequential"] = overlapped_equal;
  }
  r["step_over_kernels"] = median(total_ms) / median(kernel_ms);
  r["plan_over_kernels"] = median(plan_ms) / median(kernel_ms);
  r["checks"] = checks;
  std::fprintf(stderr,
               "loop %s %s %s %s (pool %lld pages, %lld segments): step %.3f ms = plan %.3f + upload %.3f + kernels %.3f "
               "(fwd %.3f, comb %.3f) + readback %.3f; append %.3f; step/kernels %.2f; alone: validate %.3f, device plan %.3f, q %.3f, "
               "arrays %.3f\n",
               opt.target.c_str(), opt.schedule.c_str(), dtype_name(dt).c_str(),
               (r["staging"].get<std::string>() +
                (!opt.resident_tables ? "" : r.value("decode_plan_on_device", false) ? " resident (device plan)" : " resident (host plan)"))
                   .c_str(),
               static_cast<long long>(N),
               static_cast<long long>(cache.segments()), median(total_ms), median(plan_ms), median(upload_ms),
               median(kernel_ms), median(fwd_ms), median(comb_ms), median(read_ms), decode ? median(append_ms) : 0.0,
               median(total_ms) / median(kernel_ms), median(validate_ms), median(device_plan_ms), median(q_upload_ms), median(arrays_ms));
  if (opt.overlap_parts > 0 && parts_run == 0) {
    std::fprintf(stderr, "  step_and_read ran phase by phase here (not a CUDA decode step in parts): step %.3f ms\n",
                 median(total_ms));
  } else if (opt.overlap_parts > 0) {
    std::fprintf(stderr,
                 "  overlapped in %d parts: step %.3f ms = plan %.3f + upload %.3f + overlapped %.3f; the same steps phase by "
                 "phase (the phases above from kernels on): %.3f; step/kernels %.2f; outputs bit for bit the same: %s\n",
                 parts_run, median(total_ms), median(plan_ms), median(upload_ms), median(overlapped_ms), median(seq_total_ms),
                 median(total_ms) / median(kernel_ms), overlapped_equal ? "yes" : "NO");
  }
  for (const auto& c : checks) {
    std::fprintf(stderr, "  step %d vs %s: %s (out %.3g, lse %.3g)\n", c["step"].get<int>(), check_with_direct ? "direct" : "the benchmark's run",
                 c["within_tolerance"].get<bool>() ? "matches" : "DIFFERS", c["max_out_err"].get<double>(),
                 c["max_lse_err"].get<double>());
  }
  return r;
}

}  // namespace kvouter::experiments
