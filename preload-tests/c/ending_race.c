/* A block freed as our thread's pass finds the cache empty (right after an idle block expired,
 * when the thread ends itself) must still be released and unmapped after the idle times. Each
 * round frees block A, polls the stats until A is unmapped, frees block B at once, waits a
 * second (the idle times are 70 ms: the rest is for a loaded machine) and checks the cache is
 * empty again. `ending_race ROUNDS`; run with
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
        usleep(1000 * 1000);
        uint64_t cached = stats().host_cached_blocks;
        if (cached) {
            usleep(2000 * 1000);
            fprintf(stderr, "FAIL round %d: %llu block(s) cached a second after the free, %llu 2 s later\n", i,
                    (unsigned long long)cached, (unsigned long long)stats().host_cached_blocks);
            return 1;
        }
    }
    printf("ending race ok\n");
    return 0;
}
