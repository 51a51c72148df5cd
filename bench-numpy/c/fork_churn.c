/* What fork() costs the parent while other threads churn large blocks (issue 34, item 5):
 * `fork_churn THREADS BLOCKS FORKS`. BLOCKS blocks of 8 MiB + i pages are written and freed
 * first (under tensormalloc they sit in the cache); THREADS threads then loop over malloc of
 * 2-16 MiB, a write to every page, free; the main thread forks FORKS times, 5 ms apart, each
 * child exiting at once, and times the fork() call in the parent alone. Prints one JSON line:
 * the median, 90th percentile and largest fork() time in ms, and the churn's rounds. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static atomic_long rounds;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *churn(void *arg) {
    unsigned seed = (unsigned)(size_t)arg;
    while (!atomic_load(&stop)) {
        size_t n = ((size_t)2 << 20) << (rand_r(&seed) % 4); /* 2, 4, 8 or 16 MiB */
        char *p = malloc(n);
        if (!p) continue;
        for (size_t i = 0; i < n; i += 4096) p[i] = (char)i;
        free(p);
        atomic_fetch_add(&rounds, 1);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    int blocks = argc > 2 ? atoi(argv[2]) : 64;
    int forks = argc > 3 ? atoi(argv[3]) : 100;
    if (threads < 0 || threads > 64 || blocks < 0 || blocks > 1024 || forks < 1) return 2;
    char **p = calloc((size_t)blocks + 1, sizeof *p);
    for (int i = 0; i < blocks; i++) {
        size_t n = ((size_t)8 << 20) + (size_t)i * 4096;
        p[i] = malloc(n);
        if (!p[i]) return 1;
        memset(p[i], 1, n);
    }
    for (int i = 0; i < blocks; i++) free(p[i]);
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, churn, (void *)(size_t)(i + 1));
    struct timespec gap = {0, 5 * 1000 * 1000};
    nanosleep(&gap, NULL);
    double *ms = calloc((size_t)forks, sizeof *ms);
    for (int i = 0; i < forks; i++) {
        double t0 = now_ms();
        pid_t pid = fork();
        double t1 = now_ms();
        if (pid < 0) return 1;
        if (pid == 0) _exit(0);
        ms[i] = t1 - t0;
        int status;
        waitpid(pid, &status, 0);
        nanosleep(&gap, NULL);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    qsort(ms, (size_t)forks, sizeof *ms, cmp);
    printf("{\"median_ms\": %.3f, \"p90_ms\": %.3f, \"max_ms\": %.3f, \"churn_rounds\": %ld}\n", ms[forks / 2], ms[forks * 9 / 10], ms[forks - 1],
           atomic_load(&rounds));
    return 0;
}
