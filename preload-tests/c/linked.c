/* Linked with -ltensormalloc and no LD_PRELOAD: the header's API works and large blocks are
 * cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tensormalloc.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "CHECK failed line %d: %s\n", __LINE__, #c); return 1; } } while (0)

int main(void) {
    CHECK(strlen(tm_version()) > 0);
    for (int i = 0; i < 10; i++) {
        char *p = malloc(32 << 20);
        CHECK(p);
        memset(p, i, 32 << 20);
        free(p);
    }
    tm_stats_t s = {.size = sizeof s};
    CHECK(tm_get_stats(&s) == 0);
    CHECK(s.size == sizeof s && s.version >= 1);
    CHECK(s.host_requests == 10 && s.host_hits == 9);
    CHECK(s.host_cached_bytes >= (32 << 20));
    CHECK(tm_trim() >= (32 << 20));
    CHECK(tm_get_stats(&s) == 0 && s.host_cached_bytes == 0);
    CHECK(tm_set_enabled(0) == 1 && tm_is_enabled() == 0);
    char *p = malloc(32 << 20);
    free(p);
    CHECK(tm_get_stats(&s) == 0 && s.host_requests == 10);
    CHECK(tm_set_enabled(1) == 0);
    tm_stats_t small = {.size = 16};
    CHECK(tm_get_stats(&small) == 0 && small.size == 16 && small.host_requests == 0);
    CHECK(tm_get_stats(NULL) == -1);
    /* scopes: nested, per thread, counting large blocks */
    tm_scope_t sc;
    CHECK(tm_scope_end(&sc) == -1);
    CHECK(tm_scope_begin("outer") == 1);
    char *keep = malloc(16 << 20);
    CHECK(tm_scope_begin("inner") == 2);
    free(malloc(16 << 20));
    free(malloc(100)); /* small: not counted */
    CHECK(tm_scope_current(&sc) == 0 && sc.allocations == 1 && sc.live_bytes == 0);
    CHECK(tm_scope_end(&sc) == 0 && strcmp(sc.name, "inner") == 0 && sc.peak_bytes == (16 << 20));
    CHECK(tm_scope_end(&sc) == 0 && sc.depth == 1 && sc.allocations == 2 && sc.frees == 1);
    CHECK(sc.live_bytes == (16 << 20) && sc.peak_bytes == (32 << 20));
    free(keep);
    puts("linked ok");
    return 0;
}
