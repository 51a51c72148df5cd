/* A ring of 64 live blocks replaced in turn, each request 4 KiB larger than the one before it
 * (200 KB to 400 KB, as a JVM's ring of direct buffers), one byte of each touched. No cached
 * block fits a request within the waste bound (10% with this many live), and each request used
 * to gather the pages of several cached blocks into a new mapping (mmap, munmap, two mremap),
 * leaving a new piece that kept the pattern going: a third of the requests, 40 times glibc's
 * time (the runtimes hunter's ring3.c). Prints "ring ok". */
#include "check.h"

int main(void) {
    enum { SLOTS = 64, ROUNDS = 20000 };
    static char *slot[SLOTS];
    for (int i = 0; i < ROUNDS; i++) {
        int j = i % SLOTS;
        free(slot[j]);
        size_t size = 200000 + (size_t)(i % 50) * 4096;
        slot[j] = malloc(size);
        CHECK(slot[j]);
        slot[j][0] = 1;
        slot[j][size - 1] = 2;
    }
    printf("ring ok\n");
    return 0;
}
