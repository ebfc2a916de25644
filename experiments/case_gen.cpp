#include "case_gen.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "kvouter/errors.h"

namespace kvouter::experiments {

// Uniform [-1, 1) * scale, in chunks of 2^20 values, each from its own generator seeded by
// (seed, chunk): the same values for any thread count, and fast for the GPU shapes' 2 x 17 GB of
// K/V (a single generator took about 3 minutes for gpu-decode).
static void fill_uniform(HostArray<float>& v, uint64_t seed, float scale) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t n = static_cast<int64_t>(v.size()), chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(c));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = c * kChunk, e = std::min(n, i + kChunk); i < e; ++i) v[static_cast<size_t>(i)] = u(g) * scale;
  }
}

// The values fill_uniform gives the pages `pages` (sorted ids) of a pool of `page_floats`-float
// pages, packed densely into dst: each touched chunk is generated as fill_uniform does, and only
// the pages' parts are kept.
static void fill_uniform_pages(HostArray<float>& dst, const std::vector<int32_t>& pages, int64_t page_floats,
                               uint64_t seed, float scale) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<int64_t> chunks;
  for (const int32_t pg : pages) {
    for (int64_t c = pg * page_floats / kChunk; c <= ((pg + 1) * page_floats - 1) / kChunk; ++c) {
      if (chunks.empty() || chunks.back() != c) chunks.push_back(c);
    }
  }
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const int64_t c = chunks[ci], g0 = c * kChunk, g1 = g0 + kChunk;
    // The pages overlapping [g0, g1).
    auto first = std::lower_bound(pages.begin(), pages.end(), static_cast<int32_t>(g0 / page_floats));
    std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(c));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    int64_t at = g0;  // the next value the generator gives
    for (auto it = first; it != pages.end() && int64_t{*it} * page_floats < g1; ++it) {
      const int64_t p0 = std::max(g0, int64_t{*it} * page_floats), p1 = std::min(g1, (int64_t{*it} + 1) * page_floats);
      for (; at < p0; ++at) (void)u(g);
      float* out = dst.data() + static_cast<size_t>((it - pages.begin()) * page_floats + (p0 - int64_t{*it} * page_floats));
      for (; at < p1; ++at) *out++ = u(g) * scale;
    }
  }
}

Inputs make_case(const CaseSpec& s) {
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const int64_t B = static_cast<int64_t>(s.qo.size());
  const int64_t Tq = std::accumulate(s.qo.begin(), s.qo.end(), int64_t{0});
  const int64_t ppb = s.block_size / s.page_size;
  const int64_t maxL = B ? *std::max_element(s.kv.begin(), s.kv.end()) : 0;
  const int64_t msb = (maxL + s.block_size - 1) / s.block_size + s.extra_blocks;
  const int64_t max_pages = msb * ppb + s.extra_pages;

  Inputs in;
  in.block_size = s.block_size;
  in.page_size = s.page_size;
  in.causal = s.causal;
  in.softmax_scale = s.scale;
  in.cu_seqlens_q = Tensor<int64_t>({B + 1});
  for (int64_t b = 0; b < B; ++b) in.cu_seqlens_q.data[b + 1] = in.cu_seqlens_q.data[b] + s.qo[b];

  // Physical pages: one per logical page of every sequence (or one shared set), shuffled.
  const int64_t pages_per_seq = max_pages;
  const int64_t num_pages = std::max<int64_t>(1, s.shared_pages ? pages_per_seq : B * pages_per_seq);
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  in.block_tables = Tensor<int32_t>({B, max_pages});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t lp = 0; lp < max_pages; ++lp) {
      const int64_t slot = s.shared_pages ? lp : b * pages_per_seq + lp;
      int32_t page = perm[static_cast<size_t>(slot % num_pages)];
      if (coin(rng) < s.neg_page_prob) page = -1;
      in.block_tables.data[b * max_pages + lp] = page;
    }
  }
  in.q = Tensor<float>({Tq, s.Hq, s.D});
  fill_uniform(in.q.data, s.seed * 3 + 3, s.q_scale);
  if (s.with_used_kv_lens) {
    in.used_kv_lens = Tensor<int32_t>({B});
    for (int64_t b = 0; b < B; ++b) in.used_kv_lens->data[b] = static_cast<int32_t>(s.kv[b]);
  }

  in.selected = Tensor<int32_t>({Tq, s.Hkv, s.topk}, -1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = s.with_used_kv_lens ? s.kv[b] : msb * s.block_size;
    for (int64_t i = 0; i < s.qo[b]; ++i) {
      const int64_t t = in.cu_seqlens_q.data[b] + i;
      for (int64_t h = 0; h < s.Hkv; ++h) {
        int32_t* row = &in.selected.data[(t * s.Hkv + h) * s.topk];
        if (s.benchmark_selection) {
          // The query's own block (right-aligned), block 0, then distinct random earlier blocks.
          const int64_t pos = std::max<int64_t>(0, L - s.qo[b] + i);
          const int64_t own = std::min(pos, std::max<int64_t>(L - 1, 0)) / s.block_size;
          std::vector<int32_t> ids = {static_cast<int32_t>(own)};
          if (own != 0) ids.push_back(0);
          std::vector<int32_t> earlier;
          for (int32_t k = 1; k < own; ++k) earlier.push_back(k);
          std::shuffle(earlier.begin(), earlier.end(), rng);
          for (int32_t k : earlier) {
            if (static_cast<int64_t>(ids.size()) >= s.topk) break;
            ids.push_back(k);
          }
          for (size_t r = 0; r < ids.size() && static_cast<int64_t>(r) < s.topk; ++r) row[r] = ids[r];
        } else {
          std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(std::max<int64_t>(msb - 1, 0)));
          for (int64_t r = 0; r < s.topk; ++r) {
            if (msb == 0 || coin(rng) < s.pad_prob) continue;
            row[r] = (r > 0 && coin(rng) < s.dup_prob) ? row[rng() % r] : pick(rng);
          }
        }
      }
    }
  }

  // K/V last: their values come from their own seeds, so the rest is the same either way.
  const int64_t page_floats = s.Hkv * s.page_size * s.D;
  if (!s.reachable_pages_only) {
    in.k_pages = Tensor<float>({num_pages, s.Hkv, s.page_size, s.D});
    in.v_pages = Tensor<float>({num_pages, s.Hkv, s.page_size, s.D});
    fill_uniform(in.k_pages.data, s.seed * 3 + 1, 1.f);
    fill_uniform(in.v_pages.data, s.seed * 3 + 2, 1.f);
    if (s.dtype != Dtype::kFloat32) in.store_as(s.dtype);
    return in;
  }
  std::vector<uint8_t> keep_block(static_cast<size_t>(B * msb), 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = in.cu_seqlens_q.data[b]; t < in.cu_seqlens_q.data[b + 1]; ++t) {
      for (int64_t i = 0; i < s.Hkv * s.topk; ++i) {
        const int32_t blk = in.selected.data[static_cast<size_t>(t * s.Hkv * s.topk + i)];
        if (blk >= 0 && blk < msb) keep_block[static_cast<size_t>(b * msb + blk)] = 1;
      }
    }
  }
  std::vector<int32_t> remap(static_cast<size_t>(num_pages), -1), kept;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t lp = 0; lp < max_pages; ++lp) {
      int32_t& pg = in.block_tables.data[static_cast<size_t>(b * max_pages + lp)];
      if (pg < 0) continue;
      if (lp / ppb >= msb || !keep_block[static_cast<size_t>(b * msb + lp / ppb)]) {
        pg = -1;
        continue;
      }
      if (remap[static_cast<size_t>(pg)] < 0) {
        remap[static_cast<size_t>(pg)] = 0;
        kept.push_back(pg);
      }
    }
  }
  std::sort(kept.begin(), kept.end());  // keeps the pool's shuffled placement
  for (size_t i = 0; i < kept.size(); ++i) remap[static_cast<size_t>(kept[i])] = static_cast<int32_t>(i);
  for (int32_t& pg : in.block_tables.data) {
    if (pg >= 0) pg = remap[static_cast<size_t>(pg)];
  }
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(kept.size()));
  in.k_pages = Tensor<float>({n, s.Hkv, s.page_size, s.D});
  in.v_pages = Tensor<float>({n, s.Hkv, s.page_size, s.D});
  fill_uniform_pages(in.k_pages.data, kept, page_floats, s.seed * 3 + 1, 1.f);
  fill_uniform_pages(in.v_pages.data, kept, page_floats, s.seed * 3 + 2, 1.f);
  if (s.dtype != Dtype::kFloat32) in.store_as(s.dtype);
  return in;
}

CaseSpec named_shape(const std::string& name) {
  CaseSpec s;
  s.benchmark_selection = true;
  s.causal = true;
  s.D = 128;
  auto batch = [&](int64_t B, int64_t qo, int64_t L) {
    s.qo.assign(static_cast<size_t>(B), qo);
    s.kv.assign(static_cast<size_t>(B), L);
  };
  if (name == "tiny") {
    batch(2, 64, 256); s.Hq = 4; s.Hkv = 2; s.block_size = 32; s.page_size = 16; s.topk = 4;
  } else if (name == "prefill") {
    batch(1, 2048, 2048); s.Hq = 16; s.Hkv = 2; s.block_size = 64; s.page_size = 16; s.topk = 16;
  } else if (name == "decode") {
    batch(64, 1, 16384); s.Hq = 32; s.Hkv = 4; s.block_size = 64; s.page_size = 16; s.topk = 16;
  } else if (name == "gpu-prefill") {
    batch(1, 32768, 32768); s.Hq = 64; s.Hkv = 4; s.block_size = 128; s.page_size = 64; s.topk = 16;
  } else if (name == "gpu-decode") {
    batch(128, 1, 65536); s.Hq = 64; s.Hkv = 4; s.block_size = 128; s.page_size = 64; s.topk = 16;
  } else {
    throw InputError("shape", "one of tiny, prefill, decode, gpu-prefill, gpu-decode", "'" + name + "'");
  }
  return s;
}

std::vector<std::string> named_shapes() { return {"tiny", "prefill", "decode", "gpu-prefill", "gpu-decode"}; }

}  // namespace kvouter::experiments
