/* Requests no memory could satisfy, by their alignment or their size, with the cache full: each
 * answers NULL (or ENOMEM) as glibc does, and leaves the cache as it was, with nothing said on
 * stderr (a program probing a limit is not short of memory). */
#include "check.h"
#include <malloc.h>

#define BLOCKS 20

int main(void) {
    void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(8 * MB);
        CHECK(blocks[i]);
        memset(blocks[i], i, 8 * MB);
    }
    for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
    tm_stats_t before = {.size = sizeof(tm_stats_t)};
    int ours = tm_stats(&before) == 0 && before.enabled;
    if (ours) CHECK(before.host_cached_bytes >= BLOCKS * 8 * MB);

    errno = 0;
    CHECK(aligned_alloc((size_t)1 << 40, 8 * MB) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(memalign((size_t)1 << 44, 8 * MB) == NULL && errno == ENOMEM);
    void *p = (void *)1;
    CHECK(posix_memalign(&p, (size_t)1 << 42, 64 * MB) == ENOMEM);
    errno = 0;
    CHECK(malloc((size_t)64 << 40) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc((size_t)1 << 20, (size_t)1 << 26) == NULL && errno == ENOMEM);

    if (ours) {
        tm_stats_t after = {.size = sizeof(tm_stats_t)};
        CHECK(tm_stats(&after) == 0);
        CHECK(after.host_cached_bytes == before.host_cached_bytes);
    }
    /* And a request that fits is served at once, from the cache when ours. */
    void *q = malloc(8 * MB);
    CHECK(q);
    free(q);
    printf("impossible ok\n");
    return 0;
}
