// The Funcs, Vars and RDoms of the two pipelines, handed by the generators to the named schedules
// in schedules/. Schedules may only schedule them; they never change what is computed.
#pragma once

#include <Halide.h>

#include "kvouter/knobs.h"

#include <map>
#include <string>

namespace kvouter::pipeline {

// Knobs every schedule may read (GeneratorParams of the same names; meanings and defaults in
// kvouter/knobs.h). A schedule ignores the ones that mean nothing to it.
struct Knobs {
  int chunk = knob_defaults::chunk;
  int vec = knob_defaults::vec;
  int rows = knob_defaults::rows;
  int unroll = knob_defaults::unroll;
  int grain = knob_defaults::grain;
  int slice = knob_defaults::slice;
  int ahead = knob_defaults::ahead;
};

// kvouter_forward: per tile, per chunk c of the block
//   s(p, row, c, tile)    = scale * q[row] . k[c*C + p]                 (reduction rd over D)
//   att(p, e, c, tile)    = position c*C + p attended by edge e (SPEC section 2's mask)
//   cmax(row, c, tile)    = max_p masked s
//   pexp(p, row, c, tile) = exp(s - cmax) where attended, else 0
//   cpv(d, row, c, tile)  = sum_p pexp * v[c*C + p][d]                 (reduction rp over C)
//   csum(row, c, tile)    = sum_p pexp
// and the online-softmax state st(ch, row, tile) = Tuple(o, m, l) runs over the chunks (update
// over rc): m' = max(m, cmax), o' = o e^(m - m') + cpv e^(cmax - m'), l' likewise. m and l are
// carried per d so that each point's update reads only itself (parallel, vectorisable, GPU
// threads). Where the block is one chunk (static_NC == 1) the update stores the chunk's
// (cpv, cmax, csum) as they are: the merge with the initial state is the identity there; and
// where the schedule asks for it (ScheduleInfo::chunk_partials) st is not defined at all, the
// partials reading cpv, cmax and csum directly.
// partials(ch, row, tile) packs [o | m | l], ch in [0, D + 2).
struct ForwardFuncs {
  // Named, so that Halide's messages and generated kernels say which stage they mean.
  Halide::Func qf{"qf"};        // (d, row, tile)          gathered, pre-scaled query rows
  Halide::Func qt{"qt"};        // (lane, d, h, t)         query t's pre-scaled rows of KV head h,
                                //                         lanes innermost; qf reads it (inlined
                                //                         unless scheduled; undefined under an
                                //                         autoscheduler)
  Halide::Func kf{"kf"};        // (d, p, c, tile)         gathered K chunk
  Halide::Func vf{"vf"};        // (d, p, c, tile)         gathered V chunk
  Halide::Func pf{"pf"};        // (p, c, tile)            request of a later tile's K and V rows
                                //                         of position p (knob ahead; 0)
  Halide::Func s{"s"};          // (p, row, c, tile)       masked scaled scores
  Halide::Func att{"att"};      // (p, e, c, tile)         bool: attended (inlined unless scheduled;
                                //                         undefined under an autoscheduler)
  Halide::Func cmax{"cmax"};    // (row, c, tile)
  Halide::Func pexp{"pexp"};    // (p, row, c, tile)
  Halide::Func cpv{"cpv"};      // (d, row, c, tile)
  Halide::Func csum{"csum"};    // (row, c, tile)
  Halide::Func st{"st"};        // (d, row, tile)          Tuple(o, m, l), online over chunks rc
                                //                         (undefined where chunk_partials)
  Halide::Func out{"out"};      // (ch, row, tile)         the packed partials (the Output)
  Halide::Var d{"d"}, p{"p"}, row{"row"}, c{"c"}, tile{"tile"}, ch{"ch"}, e{"e"}, lane{"lane"}, h{"h"}, t{"t"};
  // The output's loop over the tiles of one parallel task, where a CPU schedule splits `tile` into
  // tasks (cpu_tile_level): `tile` then names the task loop.
  Halide::Var tile_in{"tile_in"};
  Halide::RDom rd;      // over D
  Halide::RDom rp;      // over C positions
  Halide::RDom rc;      // over chunks
  Halide::Expr D;       // head dimension (a constant where specialised)
  int static_D = 0;     // 0 when D is a run-time extent
  int static_rows = 0;  // rows per tile (T * qhead) where specialised, else 0
  int static_T = 0;     // edges per tile where specialised, else 0
  int static_C = 0;     // positions per chunk where block and page are specialised, else 0
  int static_NC = 0;    // chunks per block, likewise
  int static_page = 0;  // positions per page where specialised, else 0
  Halide::Type storage = Halide::Float(32);  // q, K and V as stored (bfloat16: its bits, uint16)
  // Channels of a K or V row that start 16-byte aligned groups a schedule may load as one vector
  // (CUDA targets with D a multiple of them); 1 elsewhere.
  int kv_group = 1;
  // The partials are the one chunk's (o, m, l), read from cpv, cmax and csum; st is undefined
  // (ScheduleInfo::chunk_partials, with the block one chunk).
  bool chunk_partials = false;
};

// kvouter_combine: per (query, query head), log-sum-exp over the topk partials.
struct CombineFuncs {
  Halide::Func mval;    // (r, j, t)   m of rank r's partial, kMaskedScore when absent
  Halide::Func mmax;    // (j, t)      max over ranks
  Halide::Func lsum;    // (j, t)      sum_r w_r l_r
  Halide::Func osum;    // (d, j, t)   sum_r w_r o_r
  Halide::Func out;     // (d, j, t)   the Output
  Halide::Func lse;     // (j, t)      the Output
  Halide::Var d{"d"}, j{"j"}, t{"t"}, r{"r"};
  Halide::RDom rk;      // over topk
  Halide::Expr D;
};

using ForwardSchedule = void (*)(ForwardFuncs&, const Knobs&, const Halide::Target&);
using CombineSchedule = void (*)(CombineFuncs&, const Knobs&, const Halide::Target&);

}  // namespace kvouter::pipeline
