/* Many threads allocating on both sides of the threshold, every block checked before free. */
#include "check.h"
#include <malloc.h>
#include <pthread.h>

#define THREADS 8
#define ROUNDS 300
#define SLOTS 16

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    unsigned char *blocks[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    unsigned tags[SLOTS] = {0};
    for (int round = 0; round < ROUNDS; round++) {
        seed = seed * 1103515245 + 12345;
        int i = (seed >> 8) % SLOTS;
        if (blocks[i]) {
            CHECK(filled(blocks[i], sizes[i], tags[i]));
            if ((seed >> 4) % 3 == 0) {
                size_t n = ((seed >> 12) % 4 == 0) ? (seed % (24 * MB)) + 1 : (seed % 8192) + 1;
                unsigned char *r = realloc(blocks[i], n);
                CHECK(r);
                size_t keep = n < sizes[i] ? n : sizes[i];
                for (size_t k = 0; k < keep; k += 4096) CHECK(r[k] == (unsigned char)(tags[i] + k / 4096));
                blocks[i] = r;
                sizes[i] = n;
                fill(r, n, tags[i]);
                continue;
            }
            free(blocks[i]);
            blocks[i] = NULL;
            continue;
        }
        size_t n = ((seed >> 12) % 3 == 0) ? (seed % (24 * MB)) + 1 : (seed % 8192) + 1;
        int zeroed = (seed >> 20) % 4 == 0;
        blocks[i] = zeroed ? calloc(1, n) : malloc(n);
        CHECK(blocks[i]);
        if (zeroed)
            for (size_t k = 0; k < n; k += 4093) CHECK(blocks[i][k] == 0);
        sizes[i] = n;
        tags[i] = seed & 0xff;
        fill(blocks[i], n, tags[i]);
    }
    for (int i = 0; i < SLOTS; i++) {
        if (blocks[i]) {
            CHECK(filled(blocks[i], sizes[i], tags[i]));
            free(blocks[i]);
        }
    }
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    tm_stats_t s;
    if (tm_stats(&s) == 0 && s.enabled) {
        CHECK(s.host_requests > 100);
        CHECK(s.host_hits > 0);
        CHECK(s.host_live_bytes == 0);
    }
    puts("threads ok");
    return 0;
}
