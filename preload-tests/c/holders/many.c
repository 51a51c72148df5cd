/* test_holders.py's program for many holders: `many DIR N SIZE` dlopens DIR/libh0.so ..
 * DIR/libh{N-1}.so (copies of one library, so each is its own holder) and has each allocate
 * SIZE bytes; `many - 0 SIZE COUNT` has the program itself allocate COUNT blocks of SIZE + i;
 * `many DIR unload SIZE`: libh0.so allocates SIZE and is unloaded with its block live, then
 * libh1.so (loaded where libh0.so was, when the loader reuses the place) allocates SIZE.
 * Then it prints every row of tm_holders ("ROW name place cached live peak blocks unused"), the
 * count tm_holders answered ("COUNT n"), the bytes the program asked for ("ASKED n") and the
 * stats' live host bytes ("STATS n"). */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensormalloc.h"

#define MAX_ROWS 4096

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *dir = argv[1];
    int unload = !strcmp(argv[2], "unload");
    int n = unload ? 2 : atoi(argv[2]);
    size_t size = strtoull(argv[3], NULL, 0);
    unsigned long long asked = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/libh%d.so", dir, i);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
            return 3;
        }
        void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(h, "holder_alloc");
        void *p = alloc ? alloc(size) : NULL;
        if (!p) return 4;
        memset(p, 1, size);
        asked += size;
        if (unload && i == 0) {
            Dl_info info;
            printf("BASE0 %p\n", dladdr((void *)alloc, &info) ? info.dli_fbase : NULL);
            if (dlclose(h) != 0) return 6;
        } else if (unload) {
            Dl_info info;
            printf("BASE1 %p\n", dladdr((void *)alloc, &info) ? info.dli_fbase : NULL);
        }
    }
    if (n == 0) {
        int count = argc > 4 ? atoi(argv[4]) : 0;
        for (int i = 0; i < count; i++) {
            char *p = malloc(size + i);
            if (!p) return 4;
            p[0] = 1;
            asked += size + i;
        }
    }
    size_t (*get_holders)(tm_holder_t *, size_t, size_t) = (size_t (*)(tm_holder_t *, size_t, size_t))dlsym(RTLD_DEFAULT, "tm_get_holders");
    int (*get_stats)(tm_stats_t *) = (int (*)(tm_stats_t *))dlsym(RTLD_DEFAULT, "tm_get_stats");
    if (!get_holders || !get_stats) return 5;
    static tm_holder_t rows[MAX_ROWS];
    size_t count = get_holders(rows, MAX_ROWS, sizeof(tm_holder_t));
    for (size_t i = 0; i < count && i < MAX_ROWS; i++)
        printf("ROW %s %d %d %llu %llu %llu %llu\n", rows[i].name, rows[i].place, rows[i].cached,
               (unsigned long long)rows[i].live_bytes, (unsigned long long)rows[i].peak_bytes,
               (unsigned long long)rows[i].blocks, (unsigned long long)rows[i].unused_bytes);
    tm_stats_t s = {.size = sizeof s};
    get_stats(&s);
    printf("COUNT %zu\nASKED %llu\nSTATS %llu\n", count, asked, (unsigned long long)s.host_live_bytes);
    return 0;
}
