/* late_copy.c's later CUDA plugin: cudaMalloc as the symbol lookup finds it. */
#include <stddef.h>
int cudaMalloc(void **, size_t);
int cudaSetDevice(int);
void *plugin_alloc(size_t size) {
    void *p = NULL;
    return cudaSetDevice(0) || cudaMalloc(&p, size) ? NULL : p;
}
