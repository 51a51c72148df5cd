/* A free or realloc of a pointer inside one of our large blocks must abort the way glibc does
 * ("free(): invalid pointer") instead of reaching the next allocator, which would read the
 * block's data as a chunk header. Mode in argv[1]; "neighbours" is the other side: pointers of
 * the next allocator mapped right next to ours are freed normally. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define MB (1024 * 1024)

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    char *p = malloc(32 * MB);
    CHECK(p != NULL);
    memset(p, 0x41, 32 * MB);
    if (strcmp(mode, "interior") == 0) {
        free(p + 16);
    } else if (strcmp(mode, "interior-page") == 0) {
        free(p + 4096);
    } else if (strcmp(mode, "interior-64k") == 0) {
        free(p + 65536);
    } else if (strcmp(mode, "interior-end") == 0) {
        free(p + 32 * MB - 16);
    } else if (strcmp(mode, "interior-middle") == 0) {
        free(p + 17 * MB + 48);
    } else if (strcmp(mode, "interior-cached") == 0) {
        free(p);
        free(p + 64);
    } else if (strcmp(mode, "realloc-interior") == 0) {
        p = realloc(p + 16, 100);
    } else if (strcmp(mode, "neighbours") == 0) {
        /* Blocks of the next allocator (mmap'd by glibc from 128 KiB up) land next to ours. */
        for (int round = 0; round < 50; round++) {
            char *big[4], *mid[16], *small[64];
            for (int i = 0; i < 4; i++) big[i] = malloc((8 + i) * MB);
            for (int i = 0; i < 16; i++) mid[i] = malloc(200 * 1024 + i * 4096);
            for (int i = 0; i < 64; i++) small[i] = malloc(16 + i * 24);
            for (int i = 0; i < 16; i++) mid[i] = realloc(mid[i], 300 * 1024);
            for (int i = 0; i < 16; i++) free(mid[i]);
            for (int i = 0; i < 64; i++) free(small[i]);
            for (int i = 0; i < 4; i++) free(big[i]);
        }
        free(p);
        puts("neighbours ok");
        return 0;
    }
    puts("not reached");
    return 0;
}
