/* test_trace_holders.py's program: the two shared objects of test_holders.py (c/holders/:
 * libframework.so and libmathlib.so) and the program itself allocate and free large host blocks
 * and device blocks (over the stand-in CUDA driver) in a fixed order, under TENSORMALLOC_TRACE;
 * the test reads each holder's live bytes back from the trace. Every step is listed in the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *framework_host(size_t);
void *framework_device(size_t);
void *mathlib_host(size_t);
void *mathlib_device(size_t);
int cudaFree(void *p);

#define MIB (1ul << 20)

int main(void) {
    char *own = malloc(12 * MIB);               /* trace_holders: 12 */
    if (!own) return 3;
    memset(own, 4, 4096);
    void *f1 = framework_host(8 * MIB);         /* libframework.so: 8 */
    void *m1 = mathlib_host(16 * MIB);          /* libmathlib.so: 16 */
    void *fd = framework_device(64 * MIB);      /* device, libframework.so: 64 */
    void *md = mathlib_device(32 * MIB);        /* device, libmathlib.so: 32 */
    void *f2 = framework_host(24 * MIB);        /* libframework.so: 32 */
    if (!f1 || !m1 || !fd || !md || !f2) return 3;
    free(m1);                                   /* libmathlib.so: 0 */
    free(f1);                                   /* libframework.so: 24 */
    void *m2 = mathlib_host(40 * MIB);          /* libmathlib.so: 40 */
    if (!m2) return 3;
    cudaFree(fd);                               /* device, libframework.so: 0 */
    free(f2);                                   /* libframework.so: 0 */
    free(own);                                  /* trace_holders: 0 */
    printf("done\n");
    return 0;                                   /* m2 and md stay live */
}
