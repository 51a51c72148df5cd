/* Lock waits (issue 19, case 4): how long a malloc+free of a large block waits when threads
 * share a CPU with a thread churning large blocks. Not a test: it reports, it asserts nothing.
 *
 *   lock_wait pair [SECONDS]        two threads pinned to one CPU: one churns 4-64 MiB blocks
 *                                   (malloc, write a few pages, free), the other times
 *                                   malloc(8 MiB)+free pairs, 1 ms apart
 *   lock_wait both [SECONDS]        the same two threads, both churning 4-64 MiB and both timed
 *   lock_wait oversub N CPUS [SECONDS]
 *                                   N threads pinned to the first CPUS CPUs, each churning
 *                                   4-64 MiB blocks, every malloc+free timed
 *   lock_wait fifo [SECONDS]        pair, with the timed thread SCHED_FIFO (skipped when not
 *                                   permitted, or when RT throttling is off: a FIFO thread
 *                                   spinning on the lock would then never let its holder run)
 *
 * Prints one JSON line: variant, count (timed calls), median_us, p999_us, max_us, over_5ms
 * (calls that waited over 5 ms; the figures are over the first 2^20 calls of each thread),
 * churn_ops (untimed churn calls, to see nobody starved), or "skipped" with a reason. Build: gcc -O2 -pthread -o lock_wait lock_wait.c */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MB (1024UL * 1024UL)
#define MAX_THREADS 64
#define MAX_SAMPLES (1 << 20)

static volatile int stop;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (rc != 0) {
        fprintf(stderr, "pthread_setaffinity_np(cpu %d): %s\n", cpu, strerror(rc));
        exit(1);
    }
}

/* A few pages written: the cost is the allocator's, not the page faults'. */
static void touch(char *p, size_t n) {
    p[0] = 1;
    p[n / 2] = 2;
    p[n - 1] = 3;
}

struct samples {
    double *us;
    size_t n;
};

static void record(struct samples *s, double us) {
    if (s->n < MAX_SAMPLES) s->us[s->n++] = us;
}

struct worker {
    pthread_t thread;
    int cpu;
    int timed;        /* record every malloc+free */
    int churn;        /* 4-64 MiB random blocks, back to back; else 8 MiB, 1 ms apart */
    int fifo;         /* SCHED_FIFO */
    unsigned seed;
    long ops;
    struct samples s;
    int fifo_error;
};

static size_t churn_size(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    return ((size_t)((*seed >> 8) % 61) + 4) * MB;
}

static void *run_worker(void *arg) {
    struct worker *w = arg;
    pin(w->cpu);
    if (w->fifo) {
        struct sched_param sp = {.sched_priority = 1};
        int rc = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
        if (rc != 0) {
            w->fifo_error = rc;
            return NULL;
        }
    }
    while (!stop) {
        size_t n = w->churn ? churn_size(&w->seed) : 8 * MB;
        double t0 = w->timed ? now_us() : 0;
        char *p = malloc(n);
        if (!p) {
            fprintf(stderr, "malloc(%zu) failed\n", n);
            exit(1);
        }
        touch(p, n);
        free(p);
        if (w->timed) record(&w->s, now_us() - t0);
        w->ops++;
        if (!w->churn) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *variant, struct worker *w, int nw) {
    size_t total = 0; /* samples kept (at most MAX_SAMPLES a thread) */
    long calls = 0, churn_ops = 0;
    for (int i = 0; i < nw; i++) {
        total += w[i].s.n;
        if (w[i].timed) calls += w[i].ops;
        else churn_ops += w[i].ops;
    }
    double *all = malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < nw; i++) {
        memcpy(all + k, w[i].s.us, w[i].s.n * sizeof *all);
        k += w[i].s.n;
    }
    qsort(all, total, sizeof *all, cmp);
    size_t over = 0;
    for (size_t i = 0; i < total; i++) over += all[i] > 5000;
    double med = total ? all[total / 2] : 0, max = total ? all[total - 1] : 0;
    /* nearest rank: the smallest wait that 99.9% of the calls do not exceed */
    size_t rank = (size_t)(total * 0.999 + 0.999999);
    double p999 = total ? all[rank ? rank - 1 : 0] : 0;
    printf("{\"variant\":\"%s\",\"count\":%ld,\"median_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"over_5ms\":%zu,\"churn_ops\":%ld}\n",
           variant, calls, med, p999, max, over, churn_ops);
    free(all);
}

static int rt_throttled(void) {
    FILE *f = fopen("/proc/sys/kernel/sched_rt_runtime_us", "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
        fclose(f);
    }
    return v >= 0;
}

int main(int argc, char **argv) {
    const char *variant = argc > 1 ? argv[1] : "pair";
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int nw = 2, cpus = 1;
    double seconds = 2;
    if (!strcmp(variant, "oversub")) {
        nw = argc > 2 ? atoi(argv[2]) : 8;
        cpus = argc > 3 ? atoi(argv[3]) : 2;
        if (argc > 4) seconds = atof(argv[4]);
        if (nw < 1 || nw > MAX_THREADS || cpus < 1) return 2;
        if (cpus > ncpu) cpus = ncpu;
    } else if (argc > 2) {
        seconds = atof(argv[2]);
    }
    char name[64];
    if (!strcmp(variant, "oversub"))
        snprintf(name, sizeof name, "oversub-%dt-%dcpu", nw, cpus);
    else
        snprintf(name, sizeof name, "%s", variant);
    int fifo = !strcmp(variant, "fifo");
    if (fifo && !rt_throttled()) {
        printf("{\"variant\":\"%s\",\"skipped\":\"RT throttling is off (sched_rt_runtime_us = -1)\"}\n", name);
        return 0;
    }
    if (strcmp(variant, "pair") && strcmp(variant, "both") && strcmp(variant, "oversub") && !fifo) {
        fprintf(stderr, "unknown variant %s\n", variant);
        return 2;
    }
    struct worker w[MAX_THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < nw; i++) {
        w[i].cpu = i % cpus;
        w[i].seed = 7919u * (unsigned)i + 17;
        w[i].s.us = malloc(MAX_SAMPLES * sizeof(double)); /* 8 MiB: a large block, made now */
        if (!w[i].s.us) return 1;
        if (!strcmp(variant, "oversub") || !strcmp(variant, "both")) {
            w[i].churn = 1;
            w[i].timed = 1;
        } else {
            /* thread 0 churns untimed; thread 1 times 8 MiB pairs */
            w[i].churn = i == 0;
            w[i].timed = i == 1;
            w[i].fifo = fifo && i == 1;
        }
        /* touch the sample buffers now, so recording never faults */
        memset(w[i].s.us, 0, MAX_SAMPLES * sizeof(double));
    }
    for (int i = 0; i < nw; i++) {
        int rc = pthread_create(&w[i].thread, NULL, run_worker, &w[i]);
        if (rc) {
            fprintf(stderr, "pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    stop = 1;
    for (int i = 0; i < nw; i++) pthread_join(w[i].thread, NULL);
    for (int i = 0; i < nw; i++)
        if (w[i].fifo_error) {
            printf("{\"variant\":\"%s\",\"skipped\":\"SCHED_FIFO: %s\"}\n", name, strerror(w[i].fifo_error));
            return 0;
        }
    report(name, w, nw);
    for (int i = 0; i < nw; i++) free(w[i].s.us);
    return 0;
}
