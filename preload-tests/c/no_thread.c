/* With no thread to be made (clone refused with EAGAIN), a program frees two large blocks and
 * goes quiet: what it freed must leave RSS, as under glibc alone, which unmaps at free (Note [No
 * thread to release] in src/sys/reaper.rs). Blocks used after that still read and write right. */
#include "check.h"
#include <unistd.h>

int main(void) {
    /* One block, then nothing: the first attempt to make our thread is refused right there. */
    unsigned char *one = malloc(200 * MB);
    CHECK(one != NULL);
    fill(one, 200 * MB, 9);
    free(one);
    long first_mb = status_kb("VmRSS") / 1024;
    printf("resident after the first free: %ld MB\n", first_mb);
    CHECK(first_mb < 40);
    for (unsigned i = 0; i < 3; i++) {
        size_t n = (200 - 50 * i) * MB;
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        fill(p, n, i);
        CHECK(filled(p, n, i));
        free(p);
    }
    /* Nothing waits for a release a second later: there is no thread to make it. */
    long rss_mb = status_kb("VmRSS") / 1024;
    printf("resident after the frees: %ld MB\n", rss_mb);
    CHECK(rss_mb < 40);
    unsigned char *q = calloc(1, 64 * MB);
    CHECK(q && q[0] == 0 && q[64 * MB - 1] == 0);
    free(q);
    puts("no thread ok");
    return 0;
}
