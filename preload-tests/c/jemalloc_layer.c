/* LD_PRELOAD="libtensormalloc.so libjemalloc.so.2": small requests reach jemalloc (its per-thread
 * counter grows), large ones are served by tensormalloc's cache. */
#include "check.h"

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static uint64_t je_thread_allocated(mallctl_fn mallctl) {
    uint64_t v = 0;
    size_t len = sizeof v;
    CHECK(mallctl("thread.allocated", &v, &len, NULL, 0) == 0);
    return v;
}

int main(void) {
    mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    CHECK(mallctl != NULL);
    uint64_t before = je_thread_allocated(mallctl);
    void *small[100];
    for (int i = 0; i < 100; i++) small[i] = malloc(1000);
    uint64_t after = je_thread_allocated(mallctl);
    CHECK(after - before >= 100 * 1000);
    for (int i = 0; i < 100; i++) free(small[i]);

    before = je_thread_allocated(mallctl);
    for (int i = 0; i < 5; i++) {
        void *p = malloc(64 * MB);
        memset(p, i, 64 * MB);
        free(p);
    }
    after = je_thread_allocated(mallctl);
    CHECK(after - before < 64 * MB);
    tm_stats_t s;
    CHECK(tm_stats(&s) == 0 && s.host_requests == 5 && s.host_hits == 4);
    puts("jemalloc layering ok");
    return 0;
}
