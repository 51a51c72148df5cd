/* Shared by the scenario programs that run over the stand-in driver (c/fakecuda.c, a simulator):
 * its test hooks, and checks that a block holds what a "kernel" wrote. Include after check.h. */
#include <stddef.h>

int fakecuda_launch_memset(void *, int, size_t);
int fakecuda_read_byte(const void *, unsigned char *);
int cudaDeviceSynchronize(void);

/* The byte at p as the device holds it; -1 when p is not device memory of a live context. */
static inline int byte_at(const void *p) {
    unsigned char b = 0;
    return fakecuda_read_byte(p, &b) == 0 ? b : -1;
}

/* The first, middle and last bytes of [p, p+n) hold value. */
static inline int holds(const void *p, size_t n, int value) {
    return byte_at(p) == value && byte_at((const char *)p + n / 2) == value && byte_at((const char *)p + n - 1) == value;
}

/* A kernel writing value over [p, p+n), synchronized through the runtime, read back. */
static inline void kernel_works(void *p, size_t n, int value) {
    CHECK(fakecuda_launch_memset(p, value, n) == 0);
    CHECK(cudaDeviceSynchronize() == 0);
    CHECK(holds(p, n, value));
}
