/* test_holders.py's program: two shared objects of the test's own (libframework.so, standing for
 * a framework, and libmathlib.so, for a math library) allocate host, device and pinned memory
 * over the stand-in CUDA driver; the scenario (argv[1]) prints the holders table, or runs out of
 * memory on the device or under RLIMIT_AS and goes on. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/resource.h>
#include "tensormalloc.h"

void *framework_host(size_t);
void *framework_device(size_t);
void *mathlib_host(size_t);
void *mathlib_device(size_t);
void *mathlib_pinned(size_t);
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);

#define MIB (1ul << 20)

static void print_table(void) {
    size_t (*get_holders)(tm_holder_t *, size_t, size_t) = (size_t (*)(tm_holder_t *, size_t, size_t))dlsym(RTLD_DEFAULT, "tm_get_holders");
    int (*get_stats)(tm_stats_t *) = (int (*)(tm_stats_t *))dlsym(RTLD_DEFAULT, "tm_get_stats");
    if (!get_holders || !get_stats) {
        printf("no tensormalloc\n");
        return;
    }
    tm_holder_t rows[64];
    size_t n = get_holders(rows, 64, sizeof(tm_holder_t));
    for (size_t i = 0; i < n && i < 64; i++)
        printf("ROW %s %d %d %llu %llu %llu\n", rows[i].name, rows[i].place, rows[i].cached,
               (unsigned long long)rows[i].live_bytes, (unsigned long long)rows[i].peak_bytes,
               (unsigned long long)rows[i].blocks);
    tm_stats_t s = {.size = sizeof s};
    get_stats(&s);
    printf("STATS %llu %llu\n", (unsigned long long)s.host_live_bytes, (unsigned long long)s.cuda_live_bytes);
}

static size_t vm_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib * 1024;
}

int main(int argc, char **argv) {
    const char *scenario = argc > 1 ? argv[1] : "table";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(scenario, "table")) {
        void *f1 = framework_host(8 * MIB), *f2 = framework_host(8 * MIB);
        void *m1 = mathlib_host(16 * MIB);
        void *fd = framework_device(64 * MIB), *md = mathlib_device(32 * MIB);
        void *mp = mathlib_pinned(4 * MIB);
        if (!f1 || !f2 || !m1 || !fd || !md || !mp) return 3;
        printf("EXPECT libframework.so -1 %zu %zu\n", malloc_usable_size(f2), malloc_usable_size(f1) + malloc_usable_size(f2));
        printf("EXPECT libmathlib.so -1 %zu %zu\n", malloc_usable_size(m1), malloc_usable_size(m1));
        free(f1);
        print_table();
        return 0;
    }
    if (!strcmp(scenario, "oom_device")) {
        void *fd = framework_device(128 * MIB), *md = mathlib_device(64 * MIB);
        if (!fd || !md) return 3;
        void *p = NULL;
        int rc = cudaMalloc(&p, 200 * MIB);
        int rc2 = cudaMalloc(&p, 220 * MIB);
        printf("continued after rc %d, %d\n", rc, rc2);
        void *q = framework_device(32 * MIB);
        printf("then allocated %s\n", q ? "yes" : "no");
        return 0;
    }
    if (!strcmp(scenario, "oom_host")) {
        void (*arm)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "spy_arm");
        void (*watch)(size_t) = (void (*)(size_t))dlsym(RTLD_DEFAULT, "spy_watch");
        long (*calls)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "spy_calls");
        long (*watched)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "spy_watched_calls");
        void *f = framework_host(96 * MIB);
        if (!f || !arm || !watch || !calls || !watched) return 3;
        struct rlimit rl = {vm_bytes() + 64 * MIB, RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &rl)) return 4;
        watch(128 * MIB);
        arm(1);
        void *g = mathlib_host(128 * MIB);
        arm(0);
        printf("second block %s; allocations during the report: %ld; the request handed to the next allocator: %ld\n", g ? "served" : "refused", calls(), watched());
        free(f);
        void *h = mathlib_host(128 * MIB);
        printf("after the free: %s\n", h ? "served" : "refused");
        return 0;
    }
    return 2;
}
