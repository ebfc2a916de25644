#pragma once
// kvouter_prefetch_l2: generated CPU forwards (knob ahead, kvouter/knobs.h) call it to request the
// K row and the V row of slot `slot` of KV head `head` of physical page `page` into the L2 while
// they compute. Returns 0 (the forward adds it to its scores). Not for direct use.
#include <HalideRuntime.h>
extern "C" float kvouter_prefetch_l2(halide_buffer_t* k, halide_buffer_t* v, int slot, int head, int page);
