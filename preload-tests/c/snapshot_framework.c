/* A "framework" for the snapshot test (test_snapshot.py), built as libsnapframework.so: its own
 * calls to the CUDA runtime and to malloc, so the snapshot's frames name it. */
#include <stddef.h>
#include <stdlib.h>

int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaMallocHost(void **, size_t);

void *framework_device(size_t n) {
    void *p = NULL;
    return cudaMalloc(&p, n) == 0 ? p : NULL;
}

void framework_device_free(void *p) { cudaFree(p); }

void *framework_pinned(size_t n) {
    void *p = NULL;
    return cudaMallocHost(&p, n) == 0 ? p : NULL;
}

void *framework_host(size_t n) { return malloc(n); }
