// Shared pieces of the libFuzzer targets: a check that aborts (libFuzzer then keeps the input as a
// crash), private scratch paths, and tiny valid cases built without the experiments layer (which
// would pull in the AOT kernels).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kvouter/inputs.h"

#define FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace kvouter::fuzz {

// A scratch folder private to this process (libFuzzer's -jobs/-workers run several at once).
inline std::filesystem::path scratch_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const auto dir = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                   ("kvouter_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  FUZZ_CHECK(f.good(), "cannot write %s", path.c_str());
}

// A small valid case: 2 sequences (3 and 2 queries), L = 12 and 7, Hq 4 / Hkv 2, D 4,
// block 4 / page 2, topk 2, one unallocated page, causal.
inline Inputs tiny_case() {
  Inputs in;
  const int64_t Tq = 5, Hq = 4, Hkv = 2, D = 4, pages = 8, page = 2, max_pages = 6, topk = 2;
  in.q = Tensor<float>({Tq, Hq, D});
  in.k_pages = Tensor<float>({pages, Hkv, page, D});
  in.v_pages = Tensor<float>({pages, Hkv, page, D});
  for (size_t i = 0; i < in.q.data.size(); ++i)
    in.q.data[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
  for (size_t i = 0; i < in.k_pages.data.size(); ++i) {
    in.k_pages.data[i] = static_cast<float>(i % 5) * 0.5f - 1.f;
    in.v_pages.data[i] = static_cast<float>(i % 11) * 0.125f;
  }
  in.block_tables = Tensor<int32_t>({2, max_pages});
  in.block_tables.data = {0, 1, -1, 2, 3, 4, 5, 6, 7, -1, -1, -1};
  in.cu_seqlens_q = Tensor<int64_t>({3});
  in.cu_seqlens_q.data = {0, 3, 5};
  in.used_kv_lens = Tensor<int32_t>({2});
  in.used_kv_lens->data = {12, 7};
  in.selected = Tensor<int32_t>({Tq, Hkv, topk});
  const int32_t sel[] = {0, 2, 1, -1, 0, 0, 2, 1, 1, 2, 0, 1, 0, 1, -1, 1, 1, 0, 0, 1};
  in.selected.data.assign(std::begin(sel), std::end(sel));
  in.block_size = 4;
  in.page_size = 2;
  in.causal = true;
  return in;
}

}  // namespace kvouter::fuzz
