/* A plugin as some frameworks load their CUDA backends: linked with -lcuda and loaded by
 * c/cuda_misuse.c with dlopen(RTLD_NOW | RTLD_DEEPBIND), so its driver calls bind to the driver
 * (the stand-in, c/fakecuda.c) before any preloaded library's symbols. */
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);

int plugin_alloc(CUdeviceptr *p, size_t n) { return cuMemAlloc_v2(p, n); }
int plugin_free(CUdeviceptr p) { return cuMemFree_v2(p); }
