/* Signals that arrive while a thread is inside our work (Note [Signals off our stack]).
 *   stop-world ROUNDS: a stop-the-world collector as Boehm GC and Mono have one: SIGUSR1 makes
 *       each of 3 worker threads acknowledge and wait in its handler for SIGUSR2; the collector
 *       waits (5 s at most) for every acknowledgement. The workers grow blocks by realloc and
 *       map and unmap pages of their own beside large blocks, so that one is often inside our
 *       work waiting for the cache lock while the holder is paused. The handler looks at its
 *       stack pointer, as a conservative collector scans from it to the thread's stack's base.
 *       Prints "stopped the world N times, paused off the thread's stack M" or "stuck".
 *   deep-handler: a timer's handler using 512 KiB of stack while the main thread grows large
 *       blocks by realloc, which runs on a stack of the allocator's: the handler must fit, and
 *       run on its thread's stack. Prints "handled N, off the thread's stack M".
 *   born-blocked CHILDREN: each forked child frees large blocks under a 50 us timer, so that the
 *       allocator makes its thread while the timer's process-directed SIGALRM keeps coming; the
 *       handler must run in the program's thread (Note [Born with signals blocked]). Prints
 *       "children N, handled elsewhere M".
 * Usage: signals_in_our_work stop-world ROUNDS | deep-handler | born-blocked CHILDREN */
#include "check.h"
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 3
static sem_t acknowledged;
static volatile sig_atomic_t generation;
static volatile int done;

static __thread uintptr_t worker_low, worker_high;
static volatile unsigned long paused_elsewhere;

/* The calling thread's stack, as pthread_getattr_np reports it. */
static void stack_bounds(uintptr_t *low, uintptr_t *high) {
    pthread_attr_t attr;
    void *base;
    size_t size;
    CHECK(pthread_getattr_np(pthread_self(), &attr) == 0 && pthread_attr_getstack(&attr, &base, &size) == 0);
    pthread_attr_destroy(&attr);
    *low = (uintptr_t)base, *high = (uintptr_t)base + size;
}

static void on_pause(int sig) {
    (void)sig;
    int saved = errno, mine = generation;
    uintptr_t here = (uintptr_t)&mine;
    /* (A pause before the worker knew its stack is not counted.) */
    if (worker_high && (here < worker_low || here >= worker_high)) __atomic_fetch_add(&paused_elsewhere, 1, __ATOMIC_RELAXED);
    sem_post(&acknowledged);
    sigset_t wait_for;
    sigfillset(&wait_for);
    sigdelset(&wait_for, SIGUSR2);
    while (generation == mine) sigsuspend(&wait_for);
    errno = saved;
}

static void on_resume(int sig) { (void)sig; }

static void *work(void *arg) {
    stack_bounds(&worker_low, &worker_high);
    size_t base = (size_t)(4 + (long)arg) * MB;
    for (unsigned long n = 0; !done; n++) {
        char *p = malloc(base + (n % 3) * 2 * MB);
        CHECK(p);
        p[0] = 1;
        char *q = realloc(p, 2 * base);
        CHECK(q);
        q[base] = 2;
        char *own = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(own != MAP_FAILED);
        own[0] = 3;
        CHECK(munmap(own, MB) == 0);
        free(q);
    }
    return NULL;
}

/* A large block freed first: the allocator makes its thread then, on its own stack with the
 * program's signals open (docs/limits.md), before any signal of this test is sent. */
static void warm_up(void) {
    char *p = malloc(8 * MB);
    CHECK(p);
    p[0] = 1;
    free(p);
}

static void stop_world(int rounds) {
    warm_up();
    CHECK(sem_init(&acknowledged, 0, 0) == 0);
    struct sigaction sa = {.sa_handler = on_pause, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    sa.sa_handler = on_resume;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR2, &sa, NULL) == 0);
    pthread_t t[WORKERS];
    for (long i = 0; i < WORKERS; i++) CHECK(pthread_create(&t[i], NULL, work, (void *)i) == 0);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < WORKERS; i++) CHECK(pthread_kill(t[i], SIGUSR1) == 0);
        for (int i = 0; i < WORKERS; i++) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 5;
            while (sem_timedwait(&acknowledged, &until) != 0) {
                if (errno == ETIMEDOUT) {
                    printf("stuck: a worker never acknowledged round %d\n", r);
                    fflush(stdout);
                    _exit(0);
                }
            }
        }
        generation++;
        for (int i = 0; i < WORKERS; i++) CHECK(pthread_kill(t[i], SIGUSR2) == 0);
        usleep(200);
    }
    done = 1;
    for (int i = 0; i < WORKERS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    printf("stopped the world %d times, paused off the thread's stack %lu\n", rounds, paused_elsewhere);
}

static volatile unsigned long handled, elsewhere;
static uintptr_t stack_low, stack_high;

static void deep(int sig) {
    (void)sig;
    volatile char frame[512 << 10];
    for (size_t i = 0; i < sizeof frame; i += 4096) frame[i] = (char)i;
    uintptr_t here = (uintptr_t)&frame[0];
    if (here < stack_low || here >= stack_high) elsewhere++;
    handled++;
}

static void deep_handler(void) {
    stack_bounds(&stack_low, &stack_high);
    warm_up();
    struct sigaction sa = {.sa_handler = deep, .sa_flags = SA_RESTART};
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval every = {{0, 200}, {0, 200}};
    CHECK(setitimer(ITIMER_REAL, &every, NULL) == 0);
    /* A large realloc runs on the allocator's stack (Note [A stack of our own]). */
    for (int i = 0; i < 3000; i++) {
        char *p = malloc(8 * MB);
        CHECK(p);
        p[0] = 1;
        p = realloc(p, 56 * MB);
        CHECK(p && p[0] == 1);
        free(p);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("handled %lu, off the thread's stack %lu\n", handled, elsewhere);
}

static volatile unsigned long alarms_elsewhere;

static void count_where(int sig) {
    (void)sig;
    if (syscall(SYS_gettid) != getpid()) alarms_elsewhere++;
}

static void born_blocked(int children) {
    int elsewhere = 0;
    for (int c = 0; c < children; c++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            struct sigaction sa = {.sa_handler = count_where, .sa_flags = SA_RESTART};
            CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
            struct itimerval every = {{0, 50}, {0, 50}};
            CHECK(setitimer(ITIMER_REAL, &every, NULL) == 0);
            for (int i = 0; i < 20; i++) {
                char *p = malloc(8 * MB);
                CHECK(p);
                p[0] = 1;
                free(p);
            }
            struct itimerval off = {{0, 0}, {0, 0}};
            setitimer(ITIMER_REAL, &off, NULL);
            _exit(alarms_elsewhere ? 3 : 0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
        elsewhere += WEXITSTATUS(status) == 3;
    }
    printf("children %d, handled elsewhere %d\n", children, elsewhere);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    if (!strcmp(argv[1], "stop-world") && argc == 3) stop_world(atoi(argv[2]));
    else if (!strcmp(argv[1], "deep-handler")) deep_handler();
    else if (!strcmp(argv[1], "born-blocked") && argc == 3) born_blocked(atoi(argv[2]));
    else CHECK(!"usage: signals_in_our_work stop-world ROUNDS | deep-handler | born-blocked CHILDREN");
    return 0;
}
