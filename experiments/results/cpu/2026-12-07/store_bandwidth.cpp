#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <sys/mman.h>
int main(){
  const size_t n = 272ull<<20; // bytes
  char* p = (char*)aligned_alloc(2<<20, n); madvise(p,n,MADV_HUGEPAGE); memset(p,1,n);
  char* src = (char*)aligned_alloc(64, 1<<16); memset(src,2,1<<16);
  for (int mode=0; mode<3; ++mode) for (int rep=0;rep<3;++rep){
    auto t0=std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for(int w=0;w<2;++w) th.emplace_back([&,w]{
      size_t lo=n/2*w, hi=lo+n/2;
      for(size_t i=lo;i<hi;i+=65536){
        for(size_t k=0;k<65536;k+=64){
          __m512 v=_mm512_load_ps((float*)(src+k));
          if(mode==0) _mm512_store_ps((float*)(p+i+k),v);
          else if(mode==1) _mm512_stream_ps((float*)(p+i+k),v);
          else { volatile float s = ((float*)(p+i+k))[0]; (void)s; }
        }
      }
    });
    for(auto&t:th)t.join();
    if(mode==1) _mm_sfence();
    double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
    printf("%s %.1f ms %.1f GB/s\n", mode==0?"store":mode==1?"stream":"readline", s*1e3, n/s/1e9);
  }
}
