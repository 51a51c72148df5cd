/* exit() called from a second thread while the main thread keeps allocating large blocks, with
 * the stats report on: the report must print and the process must end, never deadlock. */
#include "check.h"
#include <pthread.h>
#include <unistd.h>

static void *exiter(void *arg) {
    (void)arg;
    for (int i = 0; i < 50; i++) free(malloc(8 * MB));
    exit(0);
}

int main(void) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, exiter, NULL) == 0);
    for (;;) {
        unsigned char *p = malloc(16 * MB);
        CHECK(p);
        p[0] = 1;
        free(p);
    }
}
