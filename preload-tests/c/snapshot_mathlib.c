/* A "math library" for the snapshot test (test_snapshot.py), built as libsnapmath.so: a
 * workspace in device memory and host buffers of its own, so the snapshot's frames name it. */
#include <stddef.h>
#include <stdlib.h>

int cudaMalloc(void **, size_t);
int cudaFree(void *);

void *mathlib_workspace(size_t n) {
    void *p = NULL;
    return cudaMalloc(&p, n) == 0 ? p : NULL;
}

void mathlib_workspace_free(void *p) { cudaFree(p); }

void *mathlib_host(size_t n) { return malloc(n); }

void mathlib_host_free(void *p) { free(p); }
