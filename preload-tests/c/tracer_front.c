/* Run behind a tracer preloaded in front of us (c/locking_tracer.c): large blocks freed, from
 * the main thread and from a thread of the program's, then the resident set read. Prints
 * "tracer front: ok, rss MB N". */
#include "check.h"
#include <pthread.h>

static void churn(void) {
    for (int i = 0; i < 20; i++) {
        char *p = malloc(64 * MB);
        CHECK(p);
        memset(p, i, 64 * MB);
        free(p);
    }
}

static void *worker(void *unused) {
    (void)unused;
    churn();
    return NULL;
}

int main(void) {
    churn();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, worker, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    long rss_kb = 0;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &rss_kb) == 1) break;
    fclose(f);
    printf("tracer front: ok, rss MB %ld\n", rss_kb / 1024);
    return 0;
}
