/* The C API's promises at their edges. Usage: api_edges SCENARIO
 *   off-frees         blocks handed out before tm_set_enabled(0) and freed after it go back to
 *                     the system (nothing cached while off), as glibc unmaps its mmapped chunks
 *   disable-stays-off under TENSORMALLOC_DISABLE=1, tm_set_enabled(1) leaves the library off
 *   snapshot-errno    tm_snapshot replacing a file leaves errno as the program left it
 * Prints "SCENARIO ok". */
#include "check.h"
#include <unistd.h>

static int (*set_enabled)(int);
static int (*snapshot)(const char *);

int main(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : "";
    set_enabled = (int (*)(int))dlsym(RTLD_DEFAULT, "tm_set_enabled");
    snapshot = (int (*)(const char *))dlsym(RTLD_DEFAULT, "tm_snapshot");
    CHECK(set_enabled && snapshot);
    tm_stats_t st = {.size = sizeof st};
    if (!strcmp(s, "off-frees")) {
        void *b[16];
        for (int i = 0; i < 16; i++) {
            CHECK((b[i] = malloc(32 * MB)));
            memset(b[i], i + 1, 32 * MB);
        }
        CHECK(set_enabled(0) == 1);
        for (int i = 0; i < 16; i++) free(b[i]);
        CHECK(tm_stats(&st) == 0);
        size_t rss = rss_mib();
        printf("after the frees, off: cached %llu MiB, rss %zu MiB\n", (unsigned long long)(st.host_cached_bytes / MB), rss);
        CHECK(st.host_cached_bytes == 0 && rss < 100);
        /* While off, requests go to the next allocator; on again, freed blocks are cached. */
        CHECK(set_enabled(1) == 0);
        void *p = malloc(32 * MB);
        CHECK(p);
        free(p);
        CHECK(tm_stats(&st) == 0 && st.host_cached_bytes >= 32 * MB);
    } else if (!strcmp(s, "disable-stays-off")) {
        CHECK(tm_stats(&st) == 0 && !st.enabled);
        CHECK(set_enabled(1) == 0);
        CHECK(tm_stats(&st) == 0 && !st.enabled);
        void *p = malloc(32 * MB);
        CHECK(p);
        CHECK(tm_stats(&st) == 0 && st.host_live_bytes == 0);
        free(p);
    } else if (!strcmp(s, "snapshot-errno")) {
        char path[128];
        snprintf(path, sizeof path, "/tmp/api_edges.%d.pickle", (int)getpid());
        for (int i = 0; i < 2; i++) { /* the second replaces the first's files */
            errno = 1234;
            CHECK(snapshot(path) == 0);
            CHECK(errno == 1234);
        }
        unlink(path);
        char host[160];
        snprintf(host, sizeof host, "%s.host.pickle", path);
        unlink(host);
    } else {
        CHECK(!"unknown scenario");
    }
    printf("%s ok\n", s);
    return 0;
}
