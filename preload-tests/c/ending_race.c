/* A block freed as our thread's pass finds the cache empty (right after an idle block expired,
 * when the thread ends itself) must still be released and unmapped after the idle times. Each
 * round frees block A, polls the stats until A is unmapped, frees block B at once, and polls
 * until the cache is empty again (the idle times are 70 ms; it fails after 5 s, the rest being
 * for a loaded machine: a block the race leaves is cached for good). `ending_race ROUNDS`; run with
 * TENSORMALLOC_HOST_RELEASE_MS=20 TENSORMALLOC_HOST_UNMAP_MS=50. Prints "ending race ok", or
 * the round where a block stayed cached. */
#define _GNU_SOURCE
#include "check.h"
#include <time.h>
#include <unistd.h>

#define BLOCK (16 * MB)

static tm_stats_t stats(void) {
    tm_stats_t s;
    CHECK(tm_stats(&s) == 0);
    return s;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    for (int i = 0; i < rounds; i++) {
        unsigned char *a = malloc(BLOCK), *b = malloc(BLOCK + 4 * MB);
        CHECK(a && b);
        memset(a, 1, BLOCK);
        memset(b, 2, BLOCK + 4 * MB);
        uint64_t before = stats().host_unmapped_blocks;
        free(a);
        double start = now_s();
        while (stats().host_unmapped_blocks == before) {
            if (now_s() - start > 5) {
                fprintf(stderr, "FAIL round %d: the first block was never unmapped\n", i);
                return 1;
            }
        }
        free(b);
        start = now_s();
        while (stats().host_cached_blocks) {
            if (now_s() - start > 5) {
                fprintf(stderr, "FAIL round %d: %llu block(s) still cached 5 s after the free\n", i, (unsigned long long)stats().host_cached_blocks);
                return 1;
            }
            usleep(10 * 1000);
        }
    }
    printf("ending race ok\n");
    return 0;
}
