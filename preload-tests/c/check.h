/* Shared by the preload test programs: CHECK fails the process with the line that failed,
 * and tm() finds the tensormalloc API when it is loaded (NULL when it is not). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include "../../include/tensormalloc.h"

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "CHECK failed %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define MB (1024UL * 1024UL)

static inline size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    if (!v) return dflt;
    char *end;
    size_t n = strtoull(v, &end, 10);
    if (*end == 'K') n <<= 10;
    if (*end == 'M') n <<= 20;
    if (*end == 'G') n <<= 30;
    return n;
}

/* Stats through dlsym, so the same program runs with and without the library. */
static inline int tm_stats(tm_stats_t *s) {
    int (*get)(tm_stats_t *) = (int (*)(tm_stats_t *))dlsym(RTLD_DEFAULT, "tm_get_stats");
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    return get ? get(s) : -1;
}

/* A field ("RssAnon", "VmLck", ...) of /proc/self/status in kB. */
static inline long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f);
    char line[256], want[64];
    snprintf(want, sizeof want, "%s: %%ld kB", field);
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, want, &kb) == 1) break;
    fclose(f);
    CHECK(kb >= 0);
    return kb;
}

/* A field ("Rss", "LazyFree", ...) in kB of the /proc/self/smaps entry holding addr: 0 when the
 * entry lacks it, -1 when addr is not mapped. */
static inline long smaps_kb(uintptr_t addr, const char *field) {
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f);
    char line[512], want[64];
    snprintf(want, sizeof want, "%s: %%ld kB", field);
    int in = 0;
    long found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = addr >= lo && addr < hi;
            if (in) found = 0;
            continue;
        }
        long kb;
        if (in && sscanf(line, want, &kb) == 1) found = kb;
    }
    fclose(f);
    return found;
}

/* Polls cond every 10 ms for up to 20 s (a bounded wait on a condition, not a fixed sleep). */
static inline void wait_until(int (*cond)(uintptr_t), uintptr_t arg, const char *what) {
    for (int i = 0; i < 2000; i++) {
        if (cond(arg)) return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "timed out waiting for %s\n", what);
    exit(1);
}

static inline void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(seed + i / 4096);
    if (n) p[n - 1] = (unsigned char)(seed * 7);
}

static inline int filled(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i + 1 < n; i += 4096) /* p[n-1] holds the end mark */
        if (p[i] != (unsigned char)(seed + i / 4096)) return 0;
    return !n || p[n - 1] == (unsigned char)(seed * 7);
}

/* `count` mallocs of 1000 bytes, each written (the next allocator's small blocks: glibc grows its
 * heap by brk for them), kept in `piece` (room for `count`), freed newest first; prints and
 * returns how many succeeded. */
static inline int small_blocks(void **piece, int count) {
    int got = 0;
    while (got < count && (piece[got] = malloc(1000)) != NULL) {
        memset(piece[got], 1, 1000);
        got++;
    }
    printf("1000-byte mallocs: %d of %d\n", got, count);
    for (int i = got; i > 0; i--) free(piece[i - 1]);
    return got;
}

/* `count` blocks of `size` bytes, one after another: each filled with `value`, its last byte
 * checked, and freed. A large block enters the cache, and our background thread runs. */
static inline void churn_large(int count, size_t size, int value) {
    for (int i = 0; i < count; i++) {
        char *p = malloc(size);
        CHECK(p);
        memset(p, value, size);
        CHECK(p[size - 1] == (char)value);
        free(p);
    }
}

/* The threads of this process now (/proc/self/status). */
static inline int thread_count(void) {
    char line[256];
    int n = -1;
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    fclose(f);
    return n;
}

/* Sets RLIMIT_AS to what the process has mapped now plus `extra` bytes. */
static inline void limit_address_space(long extra) {
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f && fscanf(f, "%ld", &pages) == 1);
    fclose(f);
    struct rlimit rl = {(rlim_t)(pages * 4096 + extra), RLIM_INFINITY};
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
}

/* The process's resident memory in MiB (VmRSS). */
static inline size_t rss_mib(void) {
    return (size_t)status_kb("VmRSS") / 1024;
}
