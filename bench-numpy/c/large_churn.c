/* Large-block churn: `large_churn [THREADS]` (default 2) threads each keep SLOTS blocks of
 * random 1-64 MB, replacing one at a time and touching every page of each new block; TOTAL
 * replacements in all, shared out among the threads (at least MIN_ROUNDS each). Prints one
 * JSON line: ms per 1000 replacements and minor faults per replacement. */
#include "peak.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_THREADS 64
#define SLOTS 4
#define TOTAL 800
#define MIN_ROUNDS 100

static int rounds;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 7919u + 17;
    char *slots[SLOTS] = {0};
    for (int r = 0; r < rounds; r++) {
        seed = seed * 1103515245u + 12345u;
        int i = (seed >> 8) % SLOTS;
        free(slots[i]);
        size_t n = ((size_t)((seed >> 4) % 64) + 1) << 20;
        slots[i] = malloc(n);
        for (size_t k = 0; k < n; k += 4096) slots[i][k] = (char)k;
    }
    for (int i = 0; i < SLOTS; i++) free(slots[i]);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > MAX_THREADS) return 2;
    /* at least MIN_ROUNDS each, so filling the slots at the start stays a small part */
    rounds = TOTAL / threads < MIN_ROUNDS ? MIN_ROUNDS : TOTAL / threads;
    struct timespec t0, t1;
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &u1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    double ops = (double)threads * rounds;
    printf("{\"ms\": %.3f, \"faults\": %.2f, \"peak_rss_mb\": %.1f}\n", ms / ops * 1000,
           (double)(u1.ru_minflt - u0.ru_minflt) / ops, peak_rss_mb());
    return 0;
}
