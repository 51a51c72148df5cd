/* A thread with a cancellation pending (pthread_cancel, deferred) calls into the allocator:
 * glibc's malloc family reaches no cancellation point, so the call returns and the thread is
 * cancelled at its own next one. Under us too (Note [Cancellation points] in src/sys/thread.rs).
 * Usage: cancel_pending oom|exit|info
 *   oom:  under RLIMIT_AS a large malloc the limit leaves no room for fails (its out-of-memory
 *         report written meanwhile): it returns NULL, the thread frees what it held and is
 *         cancelled at pthread_testcancel. Prints "malloc returned null, then cancelled".
 *   exit: the thread calls exit(0) (the reports asked for are written in it): the process
 *         ends with status 0; "exit did not end the process" and status 3 otherwise.
 *   info: a thread's malloc_info blocks writing to a full pipe; pthread_cancel ends it there,
 *         as glibc's own writes are cancellation points. Prints "joined: cancelled", or that the
 *         join timed out. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>
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

static int info_pipe[2];

/* Writes the allocator's report into a pipe nobody reads, already full: it blocks there. */
static void *info_worker(void *arg) {
    (void)arg;
    FILE *out = fdopen(info_pipe[1], "w");
    CHECK(out && setvbuf(out, NULL, _IONBF, 0) == 0);
    malloc_info(0, out);
    return NULL;
}

static int info_blocked(void) {
    void *big = malloc(8 * MB); /* a block of ours: malloc_info has something to say */
    CHECK(big);
    memset(big, 1, 8 * MB);
    CHECK(pipe(info_pipe) == 0);
    CHECK(fcntl(info_pipe[1], F_SETFL, O_NONBLOCK) == 0);
    char fill[4096] = {0};
    while (write(info_pipe[1], fill, sizeof fill) > 0) {}
    CHECK(fcntl(info_pipe[1], F_SETFL, 0) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, info_worker, NULL) == 0);
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(pthread_cancel(t) == 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    void *ret = NULL;
    int rc = pthread_timedjoin_np(t, &ret, &until);
    if (rc == 0) printf("joined: %s\n", ret == PTHREAD_CANCELED ? "cancelled" : "returned");
    else printf("join timed out (%d): the writer still blocked\n", rc);
    fflush(stdout);
    _exit(0); /* a thread still blocked would keep the process */
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    if (strcmp(argv[1], "info") == 0) return info_blocked();
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
