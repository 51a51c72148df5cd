/* With no thread to be made (clone refused with EAGAIN), a program frees two large blocks and
 * goes quiet: what it freed must leave RSS, as under glibc alone, which unmaps at free (Note [No
 * thread to release] in src/sys/reaper.rs). Blocks used after that still read and write right. */
#include "check.h"
#include <unistd.h>

int main(void) {
    for (unsigned i = 0; i < 3; i++) {
        size_t n = (200 - 50 * i) * MB;
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        fill(p, n, i);
        CHECK(filled(p, n, i));
        free(p);
    }
    /* The default release delay is a second: anything still held after two is held for good. */
    sleep(2);
    long rss_mb = status_kb("VmRSS") / 1024;
    printf("resident after the frees: %ld MB\n", rss_mb);
    CHECK(rss_mb < 40);
    unsigned char *q = calloc(1, 64 * MB);
    CHECK(q && q[0] == 0 && q[64 * MB - 1] == 0);
    free(q);
    puts("no thread ok");
    return 0;
}
