/* Sparse scratch buffer: `reset_cost MIB [ITERATIONS]` (default 2000) mallocs a MIB MiB block,
 * writes one byte (one page), frees it, in a loop: what a large malloc/free pair costs when
 * the program touches almost none of the block. 50 pairs warm up; then ITERATIONS pairs run
 * in 5 batches, each timed as a whole. Prints one JSON line: "ms" is the median batch's ms per
 * 1000 pairs (equal to microseconds per pair), "faults" minor faults per pair over all timed
 * batches, "peak_rss_mb" the peak RSS. */
#include "peak.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#define WARMUP 50
#define BATCHES 5

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void pair(size_t n) {
    char *p = malloc(n);
    if (!p) exit(1);
    ((volatile char *)p)[0] = 1;
    free(p);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: reset_cost MIB [ITERATIONS]\n");
        return 2;
    }
    long mib = atol(argv[1]);
    long iters = argc > 2 ? atol(argv[2]) : 2000;
    if (mib < 1 || iters < BATCHES) {
        fprintf(stderr, "reset_cost: MIB must be >= 1 and ITERATIONS >= %d\n", BATCHES);
        return 2;
    }
    size_t n = (size_t)mib << 20;
    long per_batch = iters / BATCHES;
    for (int i = 0; i < WARMUP; i++) pair(n);
    double per_pair[BATCHES];
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    for (int b = 0; b < BATCHES; b++) {
        double t = now_ms();
        for (long i = 0; i < per_batch; i++) pair(n);
        per_pair[b] = (now_ms() - t) / per_batch;
    }
    getrusage(RUSAGE_SELF, &u1);
    qsort(per_pair, BATCHES, sizeof *per_pair, cmp);
    printf("{\"ms\": %.5f, \"faults\": %.2f, \"peak_rss_mb\": %.1f}\n", per_pair[BATCHES / 2] * 1000,
           (double)(u1.ru_minflt - u0.ru_minflt) / ((double)per_batch * BATCHES), peak_rss_mb());
    return 0;
}
