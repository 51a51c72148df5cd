/* A program of Boehm GC's (libgc, a conservative collector) under the preload (Note [Signals off
 * our stack]). Worker threads keep GC objects whose only references live on their own stacks,
 * and grow and free plain large buffers by realloc (4-64 MiB, an I/O buffer's way), while a
 * collector thread collects all the time: each collection pauses every thread with a signal
 * and scans its stack from the stack pointer the pause handler saw. Every object is checked
 * after each realloc; one collected while live holds another's bytes. A large block is freed
 * before the threads start, so the allocator's stack exists and lies above theirs.
 * Prints "iterations N collections M broken K". Usage: boehm_gc THREADS SECONDS */
#define GC_THREADS
#include <gc.h>
#include "check.h"
#include <pthread.h>
#include <time.h>

#define OBJECTS 64
#define WORDS 6
static volatile int stop;
static volatile long broken;
static double seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Each word holds its own address mixed with the thread's tag: another object's bytes fail. */
static void *made(uintptr_t tag) {
    uintptr_t *o = GC_MALLOC_ATOMIC(WORDS * sizeof *o);
    CHECK(o);
    for (int i = 0; i < WORDS; i++) o[i] = (uintptr_t)&o[i] ^ tag;
    return o;
}

static int whole(const uintptr_t *o, uintptr_t tag) {
    for (int i = 0; i < WORDS; i++)
        if (o[i] != ((uintptr_t)&o[i] ^ tag)) return 0;
    return 1;
}

static void *work(void *arg) {
    uintptr_t tag = (uintptr_t)arg * 0x9E3779B97F4A7C15ull;
    void *volatile objects[OBJECTS]; /* the only references: this thread's stack */
    for (int i = 0; i < OBJECTS; i++) objects[i] = made(tag);
    unsigned seed = (unsigned)(uintptr_t)arg;
    char *big = NULL;
    long n = 0;
    for (double end = now() + seconds; now() < end; n++) {
        size_t size = (size_t)(4 + rand_r(&seed) % 61) * MB;
        big = realloc(big, size);
        CHECK(big);
        big[0] = 1, big[size - 1] = 2;
        for (int i = 0; i < OBJECTS; i++)
            if (!whole(objects[i], tag)) {
                __atomic_fetch_add(&broken, 1, __ATOMIC_RELAXED);
                objects[i] = made(tag);
            }
        objects[rand_r(&seed) % OBJECTS] = made(tag);
        if (n % 8 == 0) free(big), big = NULL;
    }
    free(big);
    return (void *)n;
}

static void *collect(void *arg) {
    (void)arg;
    while (!stop) {
        for (int i = 0; i < 2000; i++) memset(GC_MALLOC_ATOMIC(48), 0xab, 48);
        GC_gcollect();
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    GC_INIT();
    int threads = atoi(argv[1]);
    seconds = atof(argv[2]);
    CHECK(threads > 0 && threads <= 16);
    char *first = malloc(8 * MB);
    CHECK(first);
    first = realloc(first, 40 * MB);
    CHECK(first);
    free(first);
    pthread_t t[16], collector;
    CHECK(pthread_create(&collector, NULL, collect, NULL) == 0);
    for (long i = 0; i < threads; i++) CHECK(pthread_create(&t[i], NULL, work, (void *)(i + 1)) == 0);
    long total = 0;
    for (int i = 0; i < threads; i++) {
        void *n;
        CHECK(pthread_join(t[i], &n) == 0);
        total += (long)n;
    }
    stop = 1;
    CHECK(pthread_join(collector, NULL) == 0);
    printf("iterations %ld collections %lu broken %ld\n", total, (unsigned long)GC_get_gc_no(), broken);
    return 0;
}
