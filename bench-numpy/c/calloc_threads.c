/* calloc and malloc in threads that pass their blocks around: `calloc_threads THREADS`. 1,600
 * blocks of 1-8 MiB shared among the threads; each is a calloc read only, written half or whole,
 * or a malloc written whole (a quarter each), then swapped into a table the threads share, and
 * what came out freed: blocks change hands. Prints one JSON line: ms per block (wall time of
 * the whole over the blocks), minor faults per block. */
#include "peak.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define TABLE 64
#define BLOCKS 1600
static void *table[TABLE];
static int rounds;
static volatile unsigned long sink;

static void *churn(void *arg) {
    unsigned s = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    for (int i = 0; i < rounds; i++) {
        s = s * 1103515245u + 12345u;
        size_t len = (size_t)(1 + (s >> 8) % 8) << 20;
        int kind = (s >> 4) % 4;
        char *p = kind == 2 ? malloc(len) : calloc(1, len);
        if (!p) exit(1);
        unsigned long sum = 0;
        if (kind == 0) {
            for (size_t at = 0; at < len; at += 4096) sum += (unsigned char)p[at];
            if (sum) exit(3);
        } else {
            memset(p, 1, kind == 3 ? len / 2 : len);
        }
        sink += sum;
        free(__atomic_exchange_n(&table[(s >> 12) % TABLE], p, __ATOMIC_ACQ_REL));
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 16;
    if (threads < 1 || threads > 256) return 2;
    rounds = BLOCKS / threads;
    pthread_t t[256];
    struct rusage u0, u1;
    struct timespec a, b;
    getrusage(RUSAGE_SELF, &u0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    getrusage(RUSAGE_SELF, &u1);
    double blocks = (double)rounds * threads;
    double ms = ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6) / blocks;
    printf("{\"ms\": %.5f, \"faults\": %.2f, \"peak_rss_mb\": %.1f}\n", ms, (double)(u1.ru_minflt - u0.ru_minflt) / blocks, peak_rss_mb());
    for (int i = 0; i < TABLE; i++) free(table[i]);
    return 0;
}
