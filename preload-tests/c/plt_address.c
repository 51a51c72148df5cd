/* Note [A program that takes malloc's address] (src/sys/dlsym.rs): built without PIE
 * (-fno-pic -no-pie, as Debian's node), this program's code takes the addresses of malloc,
 * realloc and free, so its PLT entries are those functions' canonical addresses and
 * dlsym(RTLD_DEFAULT) answers them. They were read as an allocator in front of us: our thread was
 * never made, and every freed block was unmapped at once (node 3 to 4 times, this loop 30 times
 * glibc's time). Frees a 1 MiB block and checks it stayed mapped (cached), then that a thread
 * of ours runs (within 2 s). Prints "cached N, thread yes|no"; with `glibc`, only that the loop ran. */
#include "check.h"
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

void *(*volatile table_malloc)(size_t);
void *(*volatile table_realloc)(void *, size_t);
void (*volatile table_free)(void *);

static int our_thread(void) {
    DIR *d = opendir("/proc/self/task");
    CHECK(d);
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d))) {
        char path[64], comm[32] = {0};
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(comm, sizeof comm, f) && !strncmp(comm, "tensormalloc", 12)) found = 1;
        if (f) fclose(f);
    }
    closedir(d);
    return found;
}

int main(int argc, char **argv) {
    table_malloc = malloc, table_realloc = realloc, table_free = free;
    int cached = 0;
    for (int i = 0; i < 20; i++) {
        char *p = table_malloc(MB);
        CHECK(p);
        memset(p, i, MB);
        p = table_realloc(p, 2 * MB);
        CHECK(p && p[MB - 1] == (char)i);
        table_free(p);
        /* Still mapped: the cache kept it (glibc's free unmaps it). */
        cached += msync((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, MS_ASYNC) == 0;
    }
    if (argc > 1 && !strcmp(argv[1], "glibc")) {
        printf("ran\n");
        return 0;
    }
    /* Ours names itself as it begins: give it 2 s. */
    int thread = 0;
    for (int i = 0; i < 200 && !(thread = our_thread()); i++) usleep(10000);
    printf("cached %d, thread %s\n", cached, thread ? "yes" : "no");
    return 0;
}
