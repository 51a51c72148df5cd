/* Under `ulimit -v`, large requests that cannot be mapped return NULL with ENOMEM, the cache is
 * given up to make room first, and the process carries on. */
#include "check.h"
#include <sys/resource.h>

int main(void) {
    /* keep some cached blocks, then fail a request that only fits once they are gone */
    void *a = malloc(256 * MB), *b = malloc(256 * MB);
    CHECK(a && b);
    memset(a, 1, 256 * MB);
    free(a);
    free(b);
    void *big = malloc(700 * MB); /* limit is 1 GiB: fits only once cached blocks are given up */
    CHECK(big != NULL);
    memset(big, 2, 700 * MB);
    tm_stats_t s;
    if (tm_stats(&s) == 0 && s.enabled) CHECK(s.host_cached_bytes <= 256 * MB);
    free(big);
    errno = 0;
    void *huge = malloc(8UL << 30);
    CHECK(huge == NULL && errno == ENOMEM);
    errno = 0;
    void *cz = calloc(1, 8UL << 30);
    CHECK(cz == NULL && errno == ENOMEM);
    void *r = malloc(64 * MB);
    CHECK(r);
    errno = 0;
    CHECK(realloc(r, 8UL << 30) == NULL && errno == ENOMEM);
    memset(r, 3, 64 * MB); /* still ours, still intact */
    free(r);
    void *again = malloc(64 * MB);
    CHECK(again);
    free(again);
    puts("oom ok");
    return 0;
}
