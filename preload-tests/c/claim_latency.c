/* claim_latency THREADS SECONDS: THREADS threads churn blocks of 128 KiB to 8 MiB (each keeps its
 * last four live, touches a page of each and frees the oldest) while the main thread maps and unmaps 64 KiB of its own every millisecond, and
 * times each munmap: a munmap near our blocks waits for the ranges other threads have on their
 * way to the kernel that meet it (Note [Ranges in transit]), never for every thread in transit.
 * Prints "munmaps N p50_us P max_us M". */
#include "check.h"
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

/* Each thread keeps its last RING blocks live and frees the oldest. */
#define RING 4
static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    char *ring[RING] = {0};
    for (unsigned k = 0; !stop; k++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = (128u << 10) + (size_t)(seed >> 8) % (8u << 20);
        free(ring[k % RING]);
        char *p = ring[k % RING] = malloc(size);
        CHECK(p);
        p[0] = 1;
        p[size - 1] = 2;
    }
    for (int k = 0; k < RING; k++) free(ring[k]);
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    int threads = atoi(argv[1]);
    double seconds = atof(argv[2]);
    pthread_t t[256];
    CHECK(threads > 0 && threads <= 256);
    for (int i = 0; i < threads; i++) CHECK(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)i) == 0);
    static double took[200000];
    int n = 0;
    double end = now_us() + seconds * 1e6;
    while (now_us() < end && n < 200000) {
        char *p = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED);
        p[0] = 1;
        double before = now_us();
        CHECK(munmap(p, 64 << 10) == 0);
        took[n++] = now_us() - before;
        usleep(1000);
    }
    stop = 1;
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    qsort(took, n, sizeof took[0], by_value);
    printf("munmaps %d p50_us %.0f max_us %.0f\n", n, took[n / 2], took[n - 1]);
    return 0;
}
