/* A thread with a cancellation pending (pthread_cancel, deferred) calls into the allocator:
 * glibc's malloc family reaches no cancellation point, so the call returns and the thread is
 * cancelled at its own next one. Under us too (Note [Cancellation points] in src/sys/thread.rs).
 * Usage: cancel_pending oom|exit
 *   oom:  under RLIMIT_AS a large malloc the limit leaves no room for fails (its out-of-memory
 *         report written meanwhile): it returns NULL, the thread frees what it held and is
 *         cancelled at pthread_testcancel. Prints "malloc returned null, then cancelled".
 *   exit: the thread calls exit(0) (the reports asked for are written in it): the process
 *         ends with status 0; "exit did not end the process" and status 3 otherwise. */
#define _GNU_SOURCE
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

int main(int argc, char **argv) {
    CHECK(argc > 1);
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
