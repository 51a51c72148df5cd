/* libmathlib.so for test_holders.py: stands for a math library that allocates aligned host
 * blocks, device blocks through the driver API (cuMemAlloc) and pinned host memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int cuMemAlloc_v2(uint64_t *p, size_t size);
int cudaMallocHost(void **p, size_t size);

void *mathlib_host(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return NULL;
    memset(p, 2, 4096);
    return p;
}

void *mathlib_device(size_t size) {
    uint64_t p = 0;
    int rc = cuMemAlloc_v2(&p, size);
    return rc == 0 ? (void *)(uintptr_t)p : NULL;
}

void *mathlib_pinned(size_t size) {
    void *p = NULL;
    int rc = cudaMallocHost(&p, size);
    if (rc == 0) memset(p, 3, 64);
    return rc == 0 ? p : NULL;
}
