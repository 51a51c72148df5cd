/* A thread with the smallest stack glibc allows (PTHREAD_STACK_MIN, 16 KiB), 4 KiB of it used by
 * the program's own frames, calls into the allocator: large malloc, free, calloc, realloc (grown
 * in place or moved, from a small block, shrunk below the threshold), posix_memalign; under
 * RLIMIT_AS a large malloc that fails (its out-of-memory report written); with `exit`, it calls
 * exit(0) itself (the reports asked for written in it). glibc's malloc needs a few hundred bytes
 * of such a stack (Note [A report off the stack], Note [A stack of our own]).
 * With `pages`, 8 KiB of the thread's stack is the program's, and it makes the process's first
 * large request (its free makes our thread), maps and unmaps a page of its own, and maps one
 * where the freed block was; then a SIGSEGV handler on an 8 KiB alternate stack maps in, with
 * MAP_FIXED, the pages of a reservation put where a freed block was, as they are touched (a
 * garbage collector's way, libsigsegv's).
 * Usage: small_stack calls|exit|pages; prints "small stack ok" */
#define _GNU_SOURCE
#include <alloca.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
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

static void *pages_worker(void *arg) {
    (void)arg;
    char *own = alloca(8192);
    memset(own, 1, 8192);
    sink = own;
    char *p = malloc(8 * MB);
    CHECK(p);
    p[0] = 1;
    free(p);
    char *q = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(q != MAP_FAILED);
    q[0] = 1;
    CHECK(munmap(q, 4096) == 0);
    /* glibc's block starts 16 bytes into its mapping, ours at its start */
    char *was = (char *)((uintptr_t)p & ~(uintptr_t)4095);
    char *f = mmap(was, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(f == was);
    f[0] = 2;
    CHECK(munmap(f, 4096) == 0);
    return NULL;
}

static char *reserved;
static int mapped_in;

static void map_in(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)context;
    char *page = (char *)((uintptr_t)info->si_addr & ~(uintptr_t)4095);
    if (page < reserved || page >= reserved + 64 * 4096) abort();
    if (mmap(page, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != page) abort();
    mapped_in++;
}

/* The handler's side of `pages`, on the main thread. */
static void pages_on_demand(void) {
    char *alt = mmap(NULL, 4096 + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(alt != MAP_FAILED && mprotect(alt, 4096, PROT_NONE) == 0); /* a guard below it */
    stack_t ss = {.ss_sp = alt + 4096, .ss_size = 8192};
    CHECK(sigaltstack(&ss, NULL) == 0);
    struct sigaction sa = {.sa_sigaction = map_in, .sa_flags = SA_SIGINFO | SA_ONSTACK};
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
    char *block = malloc(16 * MB);
    CHECK(block);
    block[0] = 1;
    free(block);
    char *was = (char *)((uintptr_t)block & ~(uintptr_t)4095);
    reserved = mmap(was, 64 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(reserved == was);
    for (int i = 0; i < 64; i++) ((volatile char *)reserved)[i * 4096] = (char)i;
    CHECK(mapped_in == 64 && reserved[63 * 4096] == 63);
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    if (strcmp(argv[1], "pages") == 0) {
        pthread_attr_t attr;
        CHECK(pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) == 0);
        pthread_t t;
        CHECK(pthread_create(&t, &attr, pages_worker, NULL) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        pages_on_demand();
        printf("small stack ok\n");
        return 0;
    }
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
