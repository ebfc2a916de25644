#include "kvouter/case_io.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "kvouter/errors.h"

namespace kvouter {

namespace {

// A temp-file suffix unique to this process and call.
std::string unique_suffix() {
  static std::atomic<int> counter{0};
  return ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
}

}  // namespace

Inputs load_case(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw CaseFileError("CASE_DIR: not a directory: " + dir);
  Inputs in;
  const std::string json_path = (fs::path(dir) / "case.json").string();
  std::ifstream f(json_path);
  if (!f) throw CaseFileError("case.json: missing file " + json_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw CaseFileError("case.json: not valid JSON: " + std::string(e.what()));
  }
  if (!j.is_object()) throw InputError("case.json", "a JSON object", j.type_name());
  auto get_int = [&](const char* key) -> int64_t {
    if (!j.contains(key)) throw InputError(std::string("case.json ") + key, "an integer", "nothing");
    const auto& v = j[key];
    // An unsigned value beyond int64 would wrap to a negative one (and a misleading message).
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int64_t>::max())) {
      throw InputError(std::string("case.json ") + key, "an integer in int64 range", v.dump());
    }
    return v.get<int64_t>();
  };
  in.block_size = get_int("block_size");
  in.page_size = get_int("page_size");
  if (j.contains("causal")) {
    if (!j["causal"].is_boolean()) throw InputError("case.json causal", "true or false", j["causal"].dump());
    in.causal = j["causal"].get<bool>();
  }
  if (j.contains("softmax_scale") && !j["softmax_scale"].is_null()) {
    if (!j["softmax_scale"].is_number()) {
      throw InputError("case.json softmax_scale", "a number", j["softmax_scale"].dump());
    }
    in.softmax_scale = j["softmax_scale"].get<float>();
  }
  auto file = [&](const char* name) { return (fs::path(dir) / (std::string(name) + ".npy")).string(); };
  // SPEC section 1: q, k_pages and v_pages share one storage dtype, which case.json may name;
  // '<u2' files are bfloat16 bits only where it says so. Values are widened exactly to float32,
  // in which every backend computes.
  const std::string dq = npy_descr(file("q"), "q");
  if (dq != "<f4" && dq != "<f2" && dq != "<u2") {
    throw InputError("q dtype", "float32, float16 or bfloat16 (as uint16 bits)", npy_dtype_name(dq));
  }
  for (const char* other : {"k_pages", "v_pages"}) {
    const std::string d = npy_descr(file(other), other);
    if (d != dq) throw InputError(std::string(other) + " dtype", "q's dtype " + npy_dtype_name(dq), npy_dtype_name(d));
  }
  std::string named;
  if (j.contains("dtype")) {
    const auto& v = j["dtype"];
    if (!v.is_string() || (v != "float32" && v != "float16" && v != "bfloat16")) {
      throw InputError("case.json dtype", "\"float32\", \"float16\" or \"bfloat16\"", v.dump());
    }
    named = v.get<std::string>();
  }
  // dq is one of the three (checked above).
  const Dtype dtype = dq == "<f4" ? Dtype::kFloat32 : dq == "<f2" ? Dtype::kFloat16 : Dtype::kBFloat16;
  const std::string files = dq == "<f4" ? "float32" : dq == "<f2" ? "float16" : "bfloat16";
  if (dq == "<u2" && named != "bfloat16") {
    throw InputError("q dtype", "float32, float16, or uint16 bits with case.json \"dtype\": \"bfloat16\"",
                     "uint16 with " + (named.empty() ? std::string("no case.json dtype") : "case.json dtype " + named));
  }
  if (!named.empty() && named != files) {
    throw InputError("case.json dtype", "the files' dtype " + files, named);
  }
  // The backends read the stored values (16-bit bits as they are); the widened floats are what a
  // reference computes from.
  in.dtype = dtype;
  if (dtype == Dtype::kFloat32) {
    in.q = load_npy<float>(file("q"), "q");
    in.k_pages = load_npy<float>(file("k_pages"), "k_pages");
    in.v_pages = load_npy<float>(file("v_pages"), "v_pages");
  } else {
    for (auto [name, values, bits] : {std::tuple{"q", &in.q, &in.q_bits}, {"k_pages", &in.k_pages, &in.k_bits},
                                      {"v_pages", &in.v_pages, &in.v_bits}}) {
      *bits = load_npy_bits(file(name), name, dtype);
      *values = widened(*bits, dtype);
    }
  }
  in.selected = load_npy<int32_t>(file("selected"), "selected");
  in.block_tables = load_npy<int32_t>(file("block_tables"), "block_tables");
  in.cu_seqlens_q = load_npy<int64_t>(file("cu_seqlens_q"), "cu_seqlens_q");
  if (fs::exists(file("used_kv_lens"))) in.used_kv_lens = load_npy<int32_t>(file("used_kv_lens"), "used_kv_lens");
  return in;
}

void save_case(const std::string& dir, const Inputs& in) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };
  if (in.dtype == Dtype::kFloat32) {
    save_npy(file("q.npy"), in.q);
    save_npy(file("k_pages.npy"), in.k_pages);
    save_npy(file("v_pages.npy"), in.v_pages);
  } else {
    save_npy_bits(file("q.npy"), in.q_bits, in.dtype);
    save_npy_bits(file("k_pages.npy"), in.k_bits, in.dtype);
    save_npy_bits(file("v_pages.npy"), in.v_bits, in.dtype);
  }
  save_npy(file("selected.npy"), in.selected);
  save_npy(file("block_tables.npy"), in.block_tables);
  save_npy(file("cu_seqlens_q.npy"), in.cu_seqlens_q);
  if (in.used_kv_lens) save_npy(file("used_kv_lens.npy"), *in.used_kv_lens);
  nlohmann::json j = {{"block_size", in.block_size}, {"page_size", in.page_size}, {"causal", in.causal}};
  if (in.softmax_scale) j["softmax_scale"] = *in.softmax_scale;
  if (in.dtype != Dtype::kFloat32) j["dtype"] = dtype_name(in.dtype);
  std::ofstream(file("case.json")) << j.dump(1) << "\n";
}

void save_outputs(const std::string& dir, const Outputs& outputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string suffix = unique_suffix();
  const fs::path out = fs::path(dir) / "out.npy", lse = fs::path(dir) / "lse.npy";
  const std::string out_tmp = out.string() + suffix, lse_tmp = lse.string() + suffix;
  try {
    save_npy(out_tmp, outputs.out);
    save_npy(lse_tmp, outputs.lse);
    fs::rename(out_tmp, out);
    fs::rename(lse_tmp, lse);
  } catch (const std::exception& e) {
    fs::remove(out_tmp, ec);
    fs::remove(lse_tmp, ec);
    fs::remove(out, ec);
    throw CaseFileError(std::string("writing outputs: ") + e.what());
  }
}

}  // namespace kvouter
