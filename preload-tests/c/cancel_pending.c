/* A thread with a cancellation pending (pthread_cancel, deferred) calls into the allocator:
 * glibc's malloc family reaches no cancellation point, so the call returns and the thread is
 * cancelled at its own next one. Under us too (Note [Cancellation points] in src/sys/thread.rs).
 * Usage: cancel_pending oom|exit|info
 *   oom:  under RLIMIT_AS a large malloc the limit leaves no room for fails (its out-of-memory
 *         report written meanwhile): it returns NULL, the thread frees what it held and is
 *         cancelled at pthread_testcancel. Prints "malloc returned null, then cancelled".
 *   exit: the thread calls exit(0) (the reports asked for are written in it): the process
 *         ends with status 0; "exit did not end the process" and status 3 otherwise.
 *   info: 1000 threads, each with a cancellation pending, call malloc_info into an unbuffered
 *         FILE (glibc's own writes there are a cancellation point), then pthread_testcancel;
 *         prints how many were cancelled and how much address space the process gained. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include "check.h"

static pthread_barrier_t asked, pending;
static volatile int returned; /* 1: served, 2: null */
static volatile int freed;
void *volatile sink;

static void *oom_worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&asked);
    pthread_barrier_wait(&pending); /* the cancellation is pending from here */
    void *held = malloc(100 * MB);
    sink = held;
    void *p = malloc(200 * MB); /* 300 MiB under a limit 256 MiB over what was mapped */
    sink = p;
    returned = p ? 1 : 2;
    free(p);
    free(held);
    freed = 1;
    pthread_testcancel();
    return NULL;
}

static void *exit_worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&asked);
    pthread_barrier_wait(&pending);
    sink = malloc(64 * MB);
    free(sink);
    exit(0);
}

static FILE *info_out;

static void *info_worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&asked);
    pthread_barrier_wait(&pending);
    malloc_info(0, info_out);
    pthread_testcancel();
    return NULL;
}

static int info_rounds(int n) {
    info_out = fopen("/dev/null", "w");
    CHECK(info_out && setvbuf(info_out, NULL, _IONBF, 0) == 0);
    void *big = malloc(8 * MB); /* a block of ours: malloc_info has something to say */
    CHECK(big);
    memset(big, 1, 8 * MB);
    long before = status_kb("VmSize");
    int cancelled = 0;
    for (int i = 0; i < n; i++) {
        pthread_barrier_init(&asked, NULL, 2);
        pthread_barrier_init(&pending, NULL, 2);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, info_worker, NULL) == 0);
        pthread_barrier_wait(&asked);
        CHECK(pthread_cancel(t) == 0);
        pthread_barrier_wait(&pending);
        void *ret;
        CHECK(pthread_join(t, &ret) == 0);
        cancelled += ret == PTHREAD_CANCELED;
        pthread_barrier_destroy(&asked);
        pthread_barrier_destroy(&pending);
    }
    printf("cancelled %d of %d, address space grew by %ld MB\n", cancelled, n, (status_kb("VmSize") - before) >> 10);
    free(big);
    return 0;
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    if (strcmp(argv[1], "info") == 0) return info_rounds(1000);
    int oom = strcmp(argv[1], "oom") == 0;
    if (oom) limit_address_space(256 * (long)MB);
    pthread_barrier_init(&asked, NULL, 2);
    pthread_barrier_init(&pending, NULL, 2);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, oom ? oom_worker : exit_worker, NULL) == 0);
    pthread_barrier_wait(&asked);
    CHECK(pthread_cancel(t) == 0);
    pthread_barrier_wait(&pending);
    void *ret;
    CHECK(pthread_join(t, &ret) == 0);
    if (!oom) {
        printf("exit did not end the process\n");
        return 3;
    }
    printf("malloc returned %s, %s, then %s\n", returned == 2 ? "null" : returned == 1 ? "a block" : "nothing", freed ? "freed" : "not freed", ret == PTHREAD_CANCELED ? "cancelled" : "not cancelled");
    return 0;
}
