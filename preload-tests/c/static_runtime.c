/* nvcc's default: the CUDA runtime linked into the program (here the stand-in runtime's source,
 * c/fakecudart.c, compiled into this executable), so cudaMalloc is the program's own symbol and
 * no preload can shadow it. The runtime dlopens libcuda.so.1 and takes every driver entry point
 * through cuGetProcAddress, which is where the pool reaches it. 1000 pairs of 32 MiB. */
#include "check.h"

int cudaMalloc(void **, size_t);
int cudaFree(void *);
struct fakecuda_counters { uint64_t mallocs, frees, syncs, host_allocs, host_frees; uint64_t used[4]; };

int main(void) {
    for (int i = 0; i < 1000; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, 32 * MB) == 0 && p);
        CHECK(cudaFree(p) == 0);
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    void (*counters)(struct fakecuda_counters *) = (void (*)(struct fakecuda_counters *))dlsym(lib, "fakecuda_get_counters");
    CHECK(counters != NULL);
    struct fakecuda_counters c;
    counters(&c);
    printf("static ok mallocs %llu frees %llu\n", (unsigned long long)c.mallocs, (unsigned long long)c.frees);
    return 0;
}
