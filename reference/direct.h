// The seed-style KV-outer implementation, the honest baseline every benchmark compares against:
// index -> forward per work unit (gather the unit's K/V block once, then per (edge, head lane) a
// dot product, an online-softmax update and an axpy, 8 lanes wide) -> log-sum-exp combine.
// Threads run over work units. Neither tuned nor handicapped.
#pragma once

#include "kvouter/backend.h"

namespace kvouter::reference {

Partials direct_forward(const Plan& plan, const InputsView& in);
// Into partials made by Partials::empty(plan) (o = 0, m masked, l = 0).
void direct_forward(const Plan& plan, const InputsView& in, Partials* parts);

std::unique_ptr<Backend> make_direct_backend(const BackendConfig& cfg);

}  // namespace kvouter::reference
