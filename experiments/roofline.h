// The machine's measured peak: FP32 FMA rate over all threads and memory read bandwidth.
#pragma once

#include <string>

#include "kvouter/plan.h"

namespace kvouter::experiments {

struct Roofline {
  double fma_gflops = 0;   // FP32, 2 FLOP per FMA, all threads
  double read_gbps = 0;    // streaming read bandwidth, all threads
  int threads = 0;
  std::string isa;         // widest vector ISA the peak loop used
};

Roofline measure_roofline(double seconds_per_probe = 0.5);

// Read bandwidth, all threads, of whole chunks of `chunk_bytes` at random places of a pool of
// `pool_bytes` (kvouter/pool_memory.h), each read once: what a paged decode step's K/V traffic can
// reach here, where a block's pages are such chunks (page_size x D x the storage bytes). With
// `ahead` > 0, the reader requests each chunk's lines into the L2 (prefetcht1) while it reads the
// chunk `ahead` before it, as cpu_decode's knob ahead does (kvouter/prefetch.h).
double paged_read_gbps(size_t chunk_bytes, size_t pool_bytes = size_t{2} << 30, int reps = 5, int ahead = 0);

// The roofline bound of a planned case on this machine, in milliseconds: the larger of its FLOPs at
// the FP32 peak and its compulsory traffic (each selected K/V block once, q read, out written) at
// the read bandwidth.
double roofline_bound_ms(const Plan& plan, const Inputs& in, const Roofline& r);
std::string roofline_json(const Roofline& r);

}  // namespace kvouter::experiments
