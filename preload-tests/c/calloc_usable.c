/* calloc zeroes the whole usable size (issue 19, case 6): an 8 MiB block is written all over
 * (every byte up to malloc_usable_size) and freed, then calloc of a smaller size (6 MiB + 1, and
 * a few other odd sizes) is served from it: every byte up to malloc_usable_size of the new
 * block reads zero, as under glibc. Prints whether the block was reused (information only) and
 * "calloc usable ok". */
#include <malloc.h>
#include "check.h"

static const size_t SIZES[] = {6 * MB + 1, 4 * MB + 4097, 7 * MB + 123, 5 * MB - 3};

int main(void) {
    int failures = 0;
    for (size_t k = 0; k < sizeof SIZES / sizeof *SIZES; k++) {
        unsigned char *dirty = malloc(8 * MB);
        CHECK(dirty);
        size_t dirty_usable = malloc_usable_size(dirty);
        memset(dirty, 0xa5, dirty_usable);
        free(dirty);
        size_t n = SIZES[k];
        unsigned char *p = calloc(n, 1);
        CHECK(p);
        size_t usable = malloc_usable_size(p);
        CHECK(usable >= n);
        size_t first = usable, count = 0;
        for (size_t i = 0; i < usable; i++)
            if (p[i]) {
                if (first == usable) first = i;
                count++;
            }
        printf("calloc(%zu): usable %zu, %s the freed 8 MiB block\n", n, usable, p == dirty ? "reusing" : "not reusing");
        if (count) {
            fprintf(stderr, "calloc(%zu): %zu of %zu usable bytes not zero, the first at %zu (%ld past the request)\n",
                    n, count, usable, first, (long)first - (long)n);
            failures++;
        }
        /* A program relying on the usable size writes all of it. */
        memset(p, 1, usable);
        free(p);
    }
    if (failures) return 1;
    puts("calloc usable ok");
    return 0;
}
