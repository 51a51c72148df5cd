/* A program built against the earlier headers' tm_holder_t, which had no size or version: it asks
 * tm_holders for 2 rows into an array of 2 rows followed by a canary, with the first layout
 * (include/tensormalloc.h of d4724bc: name, place, cached, live_bytes, peak_bytes, blocks; 96
 * bytes) and with the second (a10b8c9: unused_bytes appended; 104 bytes). The library must write
 * no byte past either array (issue 34, item 7): three holders hold blocks, so there are more rows
 * than room. Prints "canary v1 intact", "canary v2 intact" and the first row's name. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { /* d4724bc */
    char name[64];
    int32_t place;
    int32_t cached;
    uint64_t live_bytes;
    uint64_t peak_bytes;
    uint64_t blocks;
} holder_v1;

typedef struct { /* a10b8c9 .. 1dcea2a */
    char name[64];
    int32_t place;
    int32_t cached;
    uint64_t live_bytes;
    uint64_t peak_bytes;
    uint64_t blocks;
    uint64_t unused_bytes;
} holder_v2;

#define CANARY 0xC0FFEE5AFEC0FFEEull

int main(void) {
    size_t (*holders)(void *, size_t) = (size_t (*)(void *, size_t))dlsym(RTLD_DEFAULT, "tm_holders");
    if (!holders) {
        printf("no tm_holders\n");
        return 1;
    }
    /* Three rows: this program's, another library's, and the cache's (a block freed). */
    char *keep = malloc(32 << 20), *gone = malloc(16 << 20);
    memset(keep, 1, 4096);
    void *(*other)(size_t) = NULL;
    void *lib = getenv("OTHER_LIB") ? dlopen(getenv("OTHER_LIB"), RTLD_NOW) : NULL;
    if (lib) other = (void *(*)(size_t))dlsym(lib, "other_malloc");
    char *theirs = other ? other(24 << 20) : NULL;
    free(gone);

    struct { holder_v1 rows[2]; uint64_t canary[8]; } v1;
    memset(&v1, 0, sizeof v1);
    for (int i = 0; i < 8; i++) v1.canary[i] = CANARY;
    size_t n1 = holders(v1.rows, 2);
    int ok1 = 1;
    for (int i = 0; i < 8; i++) ok1 &= v1.canary[i] == CANARY;

    struct { holder_v2 rows[2]; uint64_t canary[8]; } v2;
    memset(&v2, 0, sizeof v2);
    for (int i = 0; i < 8; i++) v2.canary[i] = CANARY;
    size_t n2 = holders(v2.rows, 2);
    int ok2 = 1;
    for (int i = 0; i < 8; i++) ok2 &= v2.canary[i] == CANARY;

    printf("rows: %zu %zu\n", n1, n2);
    printf("canary v1 %s\n", ok1 ? "intact" : "overwritten");
    printf("canary v2 %s\n", ok2 ? "intact" : "overwritten");
    printf("first v1 row: %s %d %llu\n", v1.rows[0].name, v1.rows[0].place, (unsigned long long)v1.rows[0].live_bytes);
    free(keep);
    free(theirs);
    return 0;
}
