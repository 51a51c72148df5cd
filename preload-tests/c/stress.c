/* Stress: THREADS threads for SECONDS (argv[1], default 5) doing random work on both sides of
 * the threshold: malloc, calloc (checked zero), realloc chains (contents checked), aligned
 * requests (alignment checked), frees after verifying every block; the main thread forks every
 * so often, and the child allocates, checks and exits. Prints the operation count. */
#include "check.h"
#include <malloc.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define THREADS 6
#define SLOTS 32

static volatile int stop;
static unsigned long ops[THREADS];

static unsigned next(unsigned *s) { *s = *s * 1103515245u + 12345u; return *s >> 4; }

static size_t random_size(unsigned *s) {
    switch (next(s) % 4) {
    case 0: return next(s) % 256 + 1;
    case 1: return next(s) % 65536 + 1;
    case 2: return next(s) % (8 * MB) + 1;
    default: return next(s) % (48 * MB) + 1;
    }
}

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg, seed = id * 2654435761u + 7;
    unsigned char *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    unsigned tag[SLOTS] = {0};
    while (!stop) {
        int i = next(&seed) % SLOTS;
        if (p[i]) CHECK(filled(p[i], n[i], tag[i]));
        switch (next(&seed) % 6) {
        case 0: /* free */
            free(p[i]);
            p[i] = NULL;
            continue;
        case 1: { /* realloc chain, contents kept */
            size_t m = random_size(&seed);
            unsigned char *r = realloc(p[i], m);
            CHECK(r);
            size_t keep = m < n[i] ? m : n[i];
            if (p[i])
                for (size_t k = 0; k + 1 < keep; k += 4096) CHECK(r[k] == (unsigned char)(tag[i] + k / 4096));
            p[i] = r;
            n[i] = m;
            break;
        }
        case 2: { /* calloc must be zero */
            free(p[i]);
            n[i] = random_size(&seed);
            p[i] = calloc(1, n[i]);
            CHECK(p[i]);
            for (size_t k = 0; k < n[i]; k += 4093) CHECK(p[i][k] == 0);
            CHECK(p[i][n[i] - 1] == 0);
            break;
        }
        case 3: { /* aligned */
            free(p[i]);
            size_t align = (size_t)16 << (next(&seed) % 20); /* 16 B .. 8 MiB */
            n[i] = random_size(&seed);
            void *q = NULL;
            CHECK(posix_memalign(&q, align, n[i]) == 0);
            CHECK(((uintptr_t)q & (align - 1)) == 0);
            p[i] = q;
            break;
        }
        default:
            free(p[i]);
            n[i] = random_size(&seed);
            p[i] = malloc(n[i]);
            CHECK(p[i]);
        }
        CHECK(malloc_usable_size(p[i]) >= n[i]);
        tag[i] = next(&seed) & 0xff;
        fill(p[i], n[i], tag[i]);
        ops[id]++;
    }
    for (int i = 0; i < SLOTS; i++) {
        if (p[i]) CHECK(filled(p[i], n[i], tag[i]));
        free(p[i]);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 5;
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    time_t end = time(NULL) + seconds;
    int forks = 0;
    while (time(NULL) < end) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            unsigned seed = (unsigned)getpid();
            for (int k = 0; k < 20; k++) {
                size_t m = random_size(&seed);
                unsigned char *q = k % 2 ? calloc(1, m) : malloc(m);
                CHECK(q);
                if (k % 2) CHECK(q[m - 1] == 0);
                fill(q, m, k);
                CHECK(filled(q, m, k));
                free(q);
            }
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
        forks++;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    stop = 1;
    unsigned long total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        total += ops[i];
    }
    tm_stats_t s;
    if (tm_stats(&s) == 0 && s.enabled) CHECK(s.host_live_bytes == 0);
    printf("stress ok: %lu operations, %d forks, %d threads, %d s\n", total, forks, THREADS, seconds);
    return 0;
}
