/* calloc of one large block, used, freed, in a loop: `calloc_churn MIB sparse|dense [huge]`.
 * sparse touches two pages (the first and one in the middle: a hash table or a buffer sized for
 * the worst case); dense adds 1 to every 8-byte element (np.zeros then use). `huge` advises
 * MADV_HUGEPAGE on the block first, as numpy does from 4 MiB up. Every block is checked to read
 * zero where it is touched. Prints one JSON line: ms per calloc+use+free, minor faults per one. */
#include "peak.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: calloc_churn MIB sparse|dense [huge]\n");
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int dense = strcmp(argv[2], "dense") == 0;
    int huge = argc > 3 && strcmp(argv[3], "huge") == 0;
    size_t words = n / 8;
    /* enough iterations for a stable median, bounded in time */
    int iters = dense ? (int)(2048 / (n >> 20)) : 400;
    if (iters < 8) iters = 8;
    if (iters > 400) iters = 400;
    double *times = calloc(iters, sizeof *times);
    struct rusage u0, u1;
    for (int i = -3; i < iters; i++) {
        if (i == 0) getrusage(RUSAGE_SELF, &u0);
        double t = now_ms();
        uint64_t *p = calloc(words, 8);
        if (!p) return 1;
        if (huge) madvise((void *)((uintptr_t)p & ~(uintptr_t)4095), n, MADV_HUGEPAGE);
        if (dense) {
            for (size_t k = 0; k < words; k++) p[k] += 1;
            if (p[0] != 1 || p[words / 2] != 1 || p[words - 1] != 1) return 3;
        } else {
            if (p[0] != 0 || p[words / 2] != 0) return 3;
            p[0] = 7;
            p[words / 2] = 7;
        }
        free(p);
        if (i >= 0) times[i] = now_ms() - t;
    }
    getrusage(RUSAGE_SELF, &u1);
    qsort(times, iters, sizeof *times, cmp);
    printf("{\"ms\": %.5f, \"faults\": %.2f, \"peak_rss_mb\": %.1f}\n", times[iters / 2],
           (double)(u1.ru_minflt - u0.ru_minflt) / iters, peak_rss_mb());
    return 0;
}
