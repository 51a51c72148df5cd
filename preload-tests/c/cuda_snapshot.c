/* The memory snapshot over the stand-in runtime: two libraries of the test's own (a framework,
 * libsnapframework.so, and a math library, libsnapmath.so) allocate device, pinned and large host
 * memory and free some. Prints one JSON line: tm_get_stats' figures and the blocks' addresses.
 * argv[1]: the path for tm_snapshot, or "-" for none (TENSORMALLOC_SNAPSHOT_AT_EXIT's run). */
#include "check.h"

void *framework_device(size_t);
void framework_device_free(void *);
void *framework_pinned(size_t);
void *framework_host(size_t);
void *mathlib_workspace(size_t);
void mathlib_workspace_free(void *);
void *mathlib_host(size_t);
void mathlib_host_free(void *);

int main(int argc, char **argv) {
    CHECK(argc == 2);
    void *f1 = framework_device(3 * MB / 2);     /* carved from a 20 MiB segment (under 2 MiB) */
    void *f2 = framework_device(512 * 1024);     /* a small block: a 2 MiB segment */
    void *f3 = framework_device(700 * 1024);     /* beside it */
    void *m1 = mathlib_workspace(7 * MB / 4);    /* carved from the framework's 20 MiB segment */
    void *m2 = mathlib_workspace(MB + 1000);     /* and so is this one */
    CHECK(f1 && f2 && f3 && m1 && m2);
    framework_device_free(f2);
    mathlib_workspace_free(m2);
    void *h1 = framework_host(8 * MB);
    void *h2 = mathlib_host(24 * MB);
    void *h3 = mathlib_host(6 * MB);
    CHECK(h1 && h2 && h3);
    mathlib_host_free(h3);
    void *p1 = framework_pinned(4 * MB);
    CHECK(p1);
    tm_stats_t s;
    CHECK(tm_stats(&s) == 0);
    int rc = 0;
    if (strcmp(argv[1], "-") != 0) {
        int (*snapshot)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "tm_snapshot");
        CHECK(snapshot);
        rc = snapshot(argv[1]);
    }
    printf("{\"rc\": %d, \"cuda_live_bytes\": %llu, \"cuda_reserved_bytes\": %llu, \"host_live_bytes\": %llu, "
           "\"framework_device\": [%llu, %llu], \"mathlib_device\": [%llu], \"framework_host\": [%llu], "
           "\"mathlib_host\": [%llu], \"pinned\": [%llu]}\n",
           rc, (unsigned long long)s.cuda_live_bytes, (unsigned long long)s.cuda_reserved_bytes,
           (unsigned long long)s.host_live_bytes, (unsigned long long)(uintptr_t)f1, (unsigned long long)(uintptr_t)f3,
           (unsigned long long)(uintptr_t)m1, (unsigned long long)(uintptr_t)h1, (unsigned long long)(uintptr_t)h2,
           (unsigned long long)(uintptr_t)p1);
    return 0;
}
