/* A thread with the smallest stack glibc allows (PTHREAD_STACK_MIN, 16 KiB), 4 KiB of it used by
 * the program's own frames, calls into the allocator: large malloc, free, calloc, realloc (grown
 * in place or moved, from a small block, shrunk below the threshold), posix_memalign; under
 * RLIMIT_AS a large malloc that fails (its out-of-memory report written); with `exit`, it calls
 * exit(0) itself (the reports asked for written in it). glibc's malloc needs a few hundred bytes
 * of such a stack (Note [A report off the stack], Note [A stack of our own]).
 * Usage: small_stack calls|exit; prints "small stack ok" (calls) */
#define _GNU_SOURCE
#include <alloca.h>
#include <limits.h>
#include <pthread.h>
#include "check.h"

static int exiting;
void *volatile sink;

static void *worker(void *arg) {
    (void)arg;
    char *own = alloca(4096); /* the program's own frames */
    memset(own, 1, 4096);
    sink = own;
    for (int i = 0; i < 20; i++) {
        char *p = malloc(8 * MB);
        CHECK(p);
        p[i] = 1;
        free(p);
    }
    char *z = calloc(1, 16 * MB);
    CHECK(z && z[16 * MB - 1] == 0);
    free(z);
    char *r = malloc(4 * MB);
    CHECK(r);
    r[0] = 5;
    r = realloc(r, 32 * MB);
    CHECK(r && r[0] == 5);
    r = realloc(r, 100);
    CHECK(r && r[0] == 5);
    r = realloc(r, 16 * MB);
    CHECK(r && r[0] == 5);
    free(r);
    void *a = NULL;
    CHECK(posix_memalign(&a, 2 * MB, 8 * MB) == 0 && (uintptr_t)a % (2 * MB) == 0);
    free(a);
    if (exiting) {
        sink = malloc(64 * MB);
        free(sink);
        exit(0);
    }
    /* 300 MiB under a limit 256 MiB over what was mapped: the second fails, reported. */
    char *held = malloc(100 * MB);
    CHECK(held);
    sink = held;
    char *p = malloc(200 * MB);
    sink = p;
    CHECK(p == NULL);
    free(held);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    exiting = strcmp(argv[1], "exit") == 0;
    if (!exiting) limit_address_space(256 * (long)MB);
    pthread_attr_t attr;
    CHECK(pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, &attr, worker, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    printf("small stack ok\n");
    return 0;
}
