// The oracle: masked dense attention with Eigen matrix products, applying the full SPEC §2 mask
// per (sequence, query head), the way FlashInfer checks its block-sparse kernels. Scalar = double
// is the test oracle; Scalar = float is the "dense" benchmark baseline.
#pragma once

#include "kvouter/backend.h"
#include "kvouter/inputs.h"

namespace kvouter::reference {

template <class Scalar>
Outputs dense_attention(const InputsView& in, const Problem& p);

// The dense mask of SPEC §2 for query t (of sequence b) and KV head h over positions [0, L_b).
std::vector<uint8_t> attended_mask(const InputsView& in, const Problem& p, int64_t b, int64_t t,
                                   int64_t h);

std::unique_ptr<Backend> make_dense_backend(const BackendConfig& cfg);

}  // namespace kvouter::reference
