/* The top of glibc's heap behind us (Note [glibc's sliding threshold] in
 * src/route/glibc_slide.rs): `heap_top BIG_MIB MODE` frees one block of BIG_MIB (0: none), then
 * runs rounds of forty 100 KiB requests (under our threshold: glibc's), every page written and
 * checked, freed together, and prints "faults a round N" over the last 50 of 60 rounds. MODE:
 * "plain"; "fix-before", the program sets glibc's trim threshold to 128 KiB before the big
 * block; "fix-after", after it. glibc alone, once it has freed a large chunk, keeps the freed
 * heap top and faults no page a round; with its threshold fixed it gives the top back every
 * round and faults every page again. */
#include <sys/resource.h>
#include <malloc.h>
#include <string.h>
#include "check.h"

#define BLOCKS 40
#define SIZE (100 << 10)

static long minflt(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

static void round_of_requests(unsigned char v) {
    unsigned char *p[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        p[i] = malloc(SIZE);
        CHECK(p[i] != NULL);
        memset(p[i], v + i, SIZE);
    }
    for (int i = 0; i < BLOCKS; i++) {
        CHECK(p[i][0] == (unsigned char)(v + i) && p[i][SIZE - 1] == (unsigned char)(v + i));
        free(p[i]);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    size_t big = (size_t)atol(argv[1]) << 20;
    const char *mode = argv[2];
    if (strcmp(mode, "fix-before") == 0) CHECK(mallopt(M_TRIM_THRESHOLD, 128 << 10) == 1);
    if (big) {
        unsigned char *b = malloc(big);
        CHECK(b != NULL);
        memset(b, 7, big);
        free(b);
    }
    if (strcmp(mode, "fix-after") == 0) CHECK(mallopt(M_TRIM_THRESHOLD, 128 << 10) == 1);
    for (int r = 0; r < 10; r++) round_of_requests((unsigned char)r);
    long before = minflt();
    for (int r = 0; r < 50; r++) round_of_requests((unsigned char)r);
    printf("faults a round %ld\n", (minflt() - before) / 50);
    return 0;
}
