#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 100000000L
int main(){
  double t0,t1;
  /* 10 independent accumulators: throughput */
  t0=now();
  for(long i=0;i<N;i++){ __asm__ volatile(
    "vfmadd231ps %%zmm30,%%zmm31,%%zmm0\n vfmadd231ps %%zmm30,%%zmm31,%%zmm1\n vfmadd231ps %%zmm30,%%zmm31,%%zmm2\n vfmadd231ps %%zmm30,%%zmm31,%%zmm3\n vfmadd231ps %%zmm30,%%zmm31,%%zmm4\n"
    "vfmadd231ps %%zmm30,%%zmm31,%%zmm5\n vfmadd231ps %%zmm30,%%zmm31,%%zmm6\n vfmadd231ps %%zmm30,%%zmm31,%%zmm7\n vfmadd231ps %%zmm30,%%zmm31,%%zmm8\n vfmadd231ps %%zmm30,%%zmm31,%%zmm9\n"
    :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9");}
  t1=now(); double fma=(t1-t0)/(N*10.0);
  t0=now();
  for(long i=0;i<N;i++){ __asm__ volatile(
    "vdpbf16ps %%zmm30,%%zmm31,%%zmm0\n vdpbf16ps %%zmm30,%%zmm31,%%zmm1\n vdpbf16ps %%zmm30,%%zmm31,%%zmm2\n vdpbf16ps %%zmm30,%%zmm31,%%zmm3\n vdpbf16ps %%zmm30,%%zmm31,%%zmm4\n"
    "vdpbf16ps %%zmm30,%%zmm31,%%zmm5\n vdpbf16ps %%zmm30,%%zmm31,%%zmm6\n vdpbf16ps %%zmm30,%%zmm31,%%zmm7\n vdpbf16ps %%zmm30,%%zmm31,%%zmm8\n vdpbf16ps %%zmm30,%%zmm31,%%zmm9\n"
    :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9");}
  t1=now(); double dp=(t1-t0)/(N*10.0);
  /* one chain: latency */
  t0=now();
  for(long i=0;i<N;i++){ __asm__ volatile("vfmadd231ps %%zmm30,%%zmm31,%%zmm0\n vfmadd231ps %%zmm30,%%zmm31,%%zmm0\n vfmadd231ps %%zmm30,%%zmm31,%%zmm0\n vfmadd231ps %%zmm30,%%zmm31,%%zmm0\n":::"xmm0");}
  t1=now(); double fmal=(t1-t0)/(N*4.0);
  t0=now();
  for(long i=0;i<N;i++){ __asm__ volatile("vdpbf16ps %%zmm30,%%zmm31,%%zmm0\n vdpbf16ps %%zmm30,%%zmm31,%%zmm0\n vdpbf16ps %%zmm30,%%zmm31,%%zmm0\n vdpbf16ps %%zmm30,%%zmm31,%%zmm0\n":::"xmm0");}
  t1=now(); double dpl=(t1-t0)/(N*4.0);
  printf("ns per instr: fma tput %.4f dp tput %.4f | fma lat %.4f dp lat %.4f | ratio dp/fma tput %.2f lat %.2f\n",fma*1e9,dp*1e9,fmal*1e9,dpl*1e9,dp/fma,dpl/fmal);
  printf("FLOP per ns per core: fma %.1f dpbf16 %.1f\n", 32/(fma*1e9), 64/(dp*1e9));
}
