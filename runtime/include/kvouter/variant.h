// What a generated variant of the two pipelines is, stated once: its specialisation, its name, its
// Halide target, its knobs, and the GeneratorParams of kvouter_forward and kvouter_combine. The JIT
// (jit.cpp), `kvouter export` and generators/CMakeLists.txt's AOT variants all follow these rules;
// aot_test checks every registered AOT variant against them. No Halide here.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvouter/backend.h"

namespace kvouter::halide {

// Shape constants a variant may be specialised on (0 = generic).
struct Specialization {
  int D = 0, page_size = 0, block_size = 0, qhead = 0, T = 0;
  // The storage dtype of q, K and V: a variant is compiled for one, never generic over them.
  Dtype dtype = Dtype::kFloat32;
  // Extents that only autoscheduled twins specialise on (their estimates); 0 otherwise.
  int64_t tq = 0, hq = 0, hkv = 0, pages = 0, tiles = 0, topk = 0;
  Specialization with_extents(const Plan& plan) const;
  static Specialization of(const Plan& plan);
  std::string str() const;
};

// The name of a generated variant: kvouter_<schedule>_<generic | dD_pP_bB_qQ_tT>, then _<target> for
// a target other than "host", _<knob>_<value> for each knob given (in the order given), and
// _storage_<dtype> for 16-bit storage; every other character than [A-Za-z0-9_] becomes '_'.
// generators/CMakeLists.txt names KVOUTER_AOT_CONFIGS the same way (aot_test checks every
// registered variant), and `kvouter export` names its output so.
std::string variant_name(const std::string& schedule, const std::string& target, const Specialization& spec,
                         const std::vector<std::pair<std::string, std::string>>& knobs);

// A Halide target string with what 16-bit storage needs on it: on Vulkan, 16-bit floats for float16
// loads and 16-bit integers for both 16-bit dtypes (vk_float16, vk_int16); other targets as given.
// The JIT and `kvouter export` use it; generators/CMakeLists.txt adds the same features.
std::string storage_target(const std::string& target, Dtype dtype);

// The knobs a schedule understands, as GeneratorParams (name -> value). T is the plan's tile size.
const std::vector<std::string>& knob_names();
std::map<std::string, std::string> checked_knobs(const std::map<std::string, std::string>& params);
int64_t tile_edges_of(const std::map<std::string, std::string>& knobs);

// The GeneratorParams of a variant's two pipelines. `knobs` as checked_knobs returns them (every
// knob named; T is replaced by spec.T, the plan's tile size). The forward takes the shape, the
// storage dtype and every knob; the combine takes the shape, T, and the knobs it schedules with
// (vec, grain). Both take the autoscheduler's estimates where spec carries extents (spec.tq > 0).
// The autoscheduler and its parameters are not among them (autoscheduler_params).
struct GeneratorParams {
  std::map<std::string, std::string> forward, combine;
};
GeneratorParams generator_params(const std::string& schedule, const std::map<std::string, std::string>& knobs,
                                 const Specialization& spec);

// The knobs the combine schedules with (a subset of knob_names()).
const std::vector<std::string>& combine_knob_names();

}  // namespace kvouter::halide
