/* libframework.so for test_holders.py: stands for a framework that allocates host blocks with
 * malloc and device blocks with the runtime's cudaMalloc. Each call is followed by work, so the
 * compiler cannot turn it into a tail call (the holder is the object the call returns to). */
#include <stdlib.h>
#include <string.h>

int cudaMalloc(void **p, size_t size);

void *framework_host(size_t size) {
    char *p = malloc(size);
    if (p) memset(p, 1, 4096);
    return p;
}

void *framework_device(size_t size) {
    void *p = NULL;
    int rc = cudaMalloc(&p, size);
    return rc == 0 ? p : NULL;
}
