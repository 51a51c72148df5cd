/* A large request that does not fit under a limit while the next allocator holds free memory
 * (glibc's heap, grown by brk for small blocks the program has freed) is served from there, as
 * under glibc alone, by each entry point: malloc, calloc (zeroed), posix_memalign (aligned),
 * realloc of a large block and of a small one (their bytes kept), each freed by the program after (Note [The next
 * allocator's free memory] in src/route/room.rs).
 * Usage: next_room as|data (the limit: RLIMIT_AS or RLIMIT_DATA, 200 MiB over what is mapped) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "check.h"

#define MIB (1024L * 1024)

/* A field of /proc/self/status, in bytes. */
static long status_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0) kb = atol(line + n);
    fclose(f);
    CHECK(kb >= 0);
    return kb * 1024;
}

enum { PIECES = 600 * 1024, BIG = 500 };
static void *piece[PIECES];
static char *big[BIG];

int main(int argc, char **argv) {
    int data = argc > 1 && strcmp(argv[1], "data") == 0;
    for (int i = 0; i < PIECES; i++) {
        piece[i] = malloc(1000);
        CHECK(piece[i] != NULL);
        memset(piece[i], 1, 1000);
    }
    long mapped = status_bytes(data ? "VmData:" : "VmSize:");
    struct rlimit rl = {(rlim_t)(mapped + 200 * MIB), (rlim_t)(mapped + 200 * MIB)};
    CHECK(setrlimit(data ? RLIMIT_DATA : RLIMIT_AS, &rl) == 0);
    /* Freed in reverse: glibc keeps its heap (600 MiB) mapped, free. */
    for (int i = PIECES - 1; i >= 0; i--) free(piece[i]);

    int got = 0, off_boundary = 0;
    for (int i = 0; i < BIG; i++) {
        big[i] = malloc(MIB);
        if (!big[i]) break;
        memset(big[i], 2, MIB);
        off_boundary += (uintptr_t)big[i] % (64 * 1024) != 0;
        got++;
    }
    printf("1 MiB mallocs: %d of %d\n", got, BIG);
    /* Blocks of ours start on 64 KiB boundaries; the next allocator's do not. */
    printf("served by the next allocator: %s\n", off_boundary > 0 ? "some" : "none");

    char *z = calloc(1, 2 * MIB);
    int zero = z != NULL;
    for (long i = 0; z && i < 2 * MIB; i++) zero &= z[i] == 0;
    printf("calloc 2 MiB: %s\n", z == NULL ? "failed" : zero ? "zero" : "not zero");

    void *a = NULL;
    int rc = posix_memalign(&a, 4096, 2 * MIB);
    printf("posix_memalign 2 MiB: %s\n", rc ? "failed" : (uintptr_t)a % 4096 ? "misaligned" : "aligned");
    if (!rc) memset(a, 3, 2 * MIB);

    /* One of the first blocks (ours) grows past what the limit leaves for a new mapping. */
    char *r = realloc(big[0], 8 * MIB);
    int kept = r != NULL;
    for (long i = 0; r && i < MIB; i++) kept &= r[i] == 2;
    printf("realloc to 8 MiB: %s\n", r == NULL ? "failed" : kept ? "kept" : "changed");
    if (r) big[0] = r;

    /* A small block of the next allocator's grows past the threshold. */
    char *s = malloc(1000);
    CHECK(s != NULL);
    memset(s, 4, 1000);
    char *g = realloc(s, 8 * MIB);
    int same = g != NULL;
    for (int i = 0; g && i < 1000; i++) same &= g[i] == 4;
    printf("realloc of a small block to 8 MiB: %s\n", g == NULL ? "failed" : same ? "kept" : "changed");
    free(g ? g : s);

    for (int i = 0; i < got; i++) free(big[i]);
    free(z);
    if (!rc) free(a);
    printf("next room ok\n");
    return 0;
}
