// fuzz_case_json: the case-folder loader (load_case) and what follows it in the CLI (validate,
// make_plan). Input layout: the bytes up to the first NUL are case.json; an optional remainder
// (after the NUL) is one selector byte and the bytes of one replaced file:
//   selector % 8 = 0..6: q, k_pages, v_pages, selected, block_tables, cu_seqlens_q, used_kv_lens
//   selector % 8 = 7: used_kv_lens.npy removed
//   selector / 8 % 3: the baseline's storage dtype (float32, float16, bfloat16; float32 without
//   a selector)
// The other files come from a small valid case written once at start-up, in each dtype. Only the project's
// typed errors may come out.
#include <cstring>

#include "fuzz_common.h"
#include "kvouter/case_io.h"
#include "kvouter/errors.h"
#include "kvouter/plan.h"

namespace {

using namespace kvouter;

const char* const kFiles[] = {
    "q", "k_pages", "v_pages", "selected", "block_tables", "cu_seqlens_q", "used_kv_lens"};

// The valid case folder, kept as bytes so every input starts from the same files.
struct Baseline {
  std::filesystem::path dir;
  std::vector<std::string> bytes;  // per kFiles entry
};

Baseline make_baseline(Dtype dtype) {
  {
    Baseline b;
    b.dir = fuzz::scratch_dir("fuzz_case_json_" + dtype_name(dtype));
    Inputs in = fuzz::tiny_case();
    in.store_as(dtype);
    save_case(b.dir.string(), in);
    for (const char* name : kFiles) {
      std::ifstream f(b.dir / (std::string(name) + ".npy"), std::ios::binary);
      b.bytes.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    return b;
  }
}

const Baseline& baseline(int dtype) {
  static const Baseline bases[3] = {make_baseline(Dtype::kFloat32), make_baseline(Dtype::kFloat16),
                                    make_baseline(Dtype::kBFloat16)};
  return bases[dtype % 3];
}

void restore(const Baseline& b) {
  for (size_t i = 0; i < b.bytes.size(); ++i) {
    fuzz::write_file(b.dir / (std::string(kFiles[i]) + ".npy"),
                     reinterpret_cast<const uint8_t*>(b.bytes[i].data()), b.bytes[i].size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_size = nul ? static_cast<size_t>(nul - data) : size;
  const Baseline& b = baseline(nul && json_size + 1 < size ? data[json_size + 1] / 8 : 0);
  restore(b);
  fuzz::write_file(b.dir / "case.json", data, json_size);
  if (nul && json_size + 1 < size) {
    const uint8_t selector = data[json_size + 1] % 8;
    if (selector == 7) {
      std::filesystem::remove(b.dir / "used_kv_lens.npy");
    } else {
      fuzz::write_file(b.dir / (std::string(kFiles[selector]) + ".npy"), data + json_size + 2,
                       size - json_size - 2);
    }
  }
  try {
    const Inputs in = load_case(b.dir.string());
    const Plan plan = make_plan(in);
    FUZZ_CHECK(plan.tiles.num_tiles >= 0, "negative tile count");
  } catch (const CaseFileError&) {
  } catch (const InputError&) {
  }
  return 0;
}
