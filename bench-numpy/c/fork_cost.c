/* What a fork costs with large blocks cached: `fork_cost BLOCKS [FORKS]` (default 200 forks)
 * writes and frees BLOCKS blocks of 8 MiB (each of a different size class: 8 MiB + i pages, so
 * the cache holds them apart), then times FORKS rounds of fork(), a child that exits at once,
 * and waitpid(). Prints one JSON line: "ms" per 1000 forks (equal to us per fork), minor faults
 * per fork, peak RSS. Under tensormalloc the prepare handler keeps each cached block from the
 * child and the parent's handler readmits it (Note [Fork at the fork]): two madvise calls per
 * cached block and fork. */
#include "peak.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_BLOCKS 1024

int main(int argc, char **argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 64;
    int forks = argc > 2 ? atoi(argv[2]) : 200;
    if (blocks < 0 || blocks > MAX_BLOCKS || forks < 1) return 2;
    static char *p[MAX_BLOCKS];
    for (int i = 0; i < blocks; i++) {
        size_t n = (8u << 20) + (size_t)i * 4096;
        p[i] = malloc(n);
        if (!p[i]) return 1;
        memset(p[i], 1, n);
    }
    for (int i = 0; i < blocks; i++) free(p[i]);
    struct timespec t0, t1;
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) _exit(0);
        int status;
        if (waitpid(pid, &status, 0) != pid) return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &u1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("{\"ms\": %.3f, \"faults\": %.2f, \"peak_rss_mb\": %.1f}\n", ms / forks * 1000,
           (double)(u1.ru_minflt - u0.ru_minflt) / forks, peak_rss_mb());
    return 0;
}
