/* A steady loop that grows one block with realloc and frees it, as a buffer that doubles does:
 *   realloc_loop FROM TO ROUNDS   malloc(FROM), write it, realloc to TO, write it, free
 *   realloc_loop FROM TO ROUNDS double   malloc(FROM), then realloc to twice the size until TO,
 *                                        writing each, then free
 * Prints the minor faults and the growth of the peak RSS (kB) over the rounds after the first:
 * only a few MB are ever live, so glibc faults in each grown page about once and holds little. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static long peak_kb(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

static long faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

static void round_once(size_t from, size_t to, int doubling) {
    char *p = malloc(from);
    if (!p) exit(1);
    memset(p, 1, from);
    size_t size = from;
    do {
        size = doubling && size * 2 < to ? size * 2 : to;
        char *q = realloc(p, size);
        if (!q) exit(1);
        p = q;
        memset(p, 2, size);
    } while (size < to);
    free(p);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    size_t from = strtoul(argv[1], NULL, 0), to = strtoul(argv[2], NULL, 0);
    long rounds = atol(argv[3]);
    int doubling = argc > 4 && strcmp(argv[4], "double") == 0;
    round_once(from, to, doubling);
    long f0 = faults(), p0 = peak_kb();
    for (long i = 1; i < rounds; i++) round_once(from, to, doubling);
    printf("faults %ld peak growth %ld kB\n", faults() - f0, peak_kb() - p0);
    return 0;
}
