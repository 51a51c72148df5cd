/* Signal handlers that do what handlers may while their thread is inside a large realloc, whose
 * work runs on the allocator's own stack with the program's signals held, and whose waits and
 * copies of the program's memory run back on the thread's stack with the program's mask (Note
 * [Signals off our stack]).
 *   fork-in-wait SECONDS: the main thread grows blocks by realloc while two threads churn large
 *       blocks (the cache's lock contended) and a third sends it SIGUSR1 every 300 us; a handler
 *       that finds it interrupted a futex wait forks, and the child makes a large realloc of its
 *       own in the handler, then returns: the interrupted realloc finishes in the child, whose
 *       data is checked. Prints "forks N: children ok K, killed S, lost data L".
 *   jump-out: a realloc's copy faults on a page the program protected, and the SIGSEGV handler
 *       jumps out (sigsetjmp without the mask, as "safe copy" helpers do). The thread's mask is
 *       then the program's plus SIGSEGV, and a timer's SIGALRM is taken. Prints "blocked after
 *       the jump: SIGALRM A SIGTERM T" and "SIGALRM taken".
 *   handler-mask SECONDS: a SIGUSR1 handler (from another thread every 200 us) adds SIGUSR2 to
 *       the mask its thread returns to (its ucontext), while the thread is in a large realloc:
 *       after the realloc, SIGUSR2 is blocked. Prints "handler changed the mask N times, lost L".
 * Usage: handlers_in_our_work fork-in-wait SECONDS | jump-out | handler-mask SECONDS */
#include "check.h"
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static pid_t parent;
static pthread_t main_thread;
static volatile int in_realloc, done, edited;
static volatile unsigned long forks;

static void *churn(void *arg) {
    (void)arg;
    for (unsigned long n = 0; !done; n++) {
        char *p = malloc((6 + n % 7) * MB);
        CHECK(p);
        p[0] = 1;
        free(p);
    }
    return NULL;
}

static useconds_t kick_every;
static void *kicker(void *arg) {
    (void)arg;
    while (!done) {
        pthread_kill(main_thread, SIGUSR1);
        usleep(kick_every);
    }
    return NULL;
}

/* Fills, grows by realloc (with `in_realloc` set) and checks blocks for `seconds`; in a child
 * made inside the realloc, ends the child with 0 when its data came through, 2 when not. */
static unsigned long grow_blocks(int seconds, void (*after)(void)) {
    unsigned long n = 0;
    for (time_t end = time(NULL) + seconds; time(NULL) < end; n++) {
        size_t size = (8 + n % 5) * MB;
        char *p = malloc(size);
        CHECK(p);
        for (size_t i = 0; i < size; i += 1 << 16) p[i] = (char)(i >> 16) ^ 0x33;
        edited = 0;
        in_realloc = 1;
        char *q = realloc(p, 3 * size);
        in_realloc = 0;
        int whole = q != NULL;
        for (size_t i = 0; whole && i < size; i += 1 << 16) whole = q[i] == ((char)(i >> 16) ^ 0x33);
        if (getpid() != parent) _exit(whole ? 0 : 2);
        CHECK(whole);
        if (after) after();
        free(q);
    }
    return n;
}

static void start_helpers(pthread_t *t, void *(*kick)(void *)) {
    main_thread = pthread_self();
    parent = getpid();
    CHECK(pthread_create(&t[0], NULL, churn, NULL) == 0);
    CHECK(pthread_create(&t[1], NULL, churn, NULL) == 0);
    CHECK(pthread_create(&t[2], NULL, kick, NULL) == 0);
}

static void stop_helpers(pthread_t *t) {
    done = 1;
    for (int i = 0; i < 3; i++) CHECK(pthread_join(t[i], NULL) == 0);
}

/* Grows blocks for `seconds` with SIGUSR1 (`handler`, SA_SIGINFO and `flags`) sent to this
 * thread every `every_us` while two threads churn large blocks. */
static void grow_while_kicked(void (*handler)(int, siginfo_t *, void *), int flags, useconds_t every_us, int seconds, void (*after)(void)) {
    struct sigaction sa = {.sa_sigaction = handler, .sa_flags = SA_SIGINFO | flags};
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    kick_every = every_us;
    pthread_t t[3];
    start_helpers(t, kicker);
    grow_blocks(seconds, after);
    stop_helpers(t);
}

static void fork_when_waiting(int sig, siginfo_t *si, void *context) {
    (void)sig, (void)si;
    ucontext_t *uc = context;
    /* A futex wait (FUTEX_WAIT_PRIVATE) the signal cut short. */
    if (!in_realloc || getpid() != parent || uc->uc_mcontext.gregs[REG_RSI] != 128 || uc->uc_mcontext.gregs[REG_RAX] != -EINTR) return;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        char *x = malloc(12 * MB);
        if (x) {
            memset(x, 0x5a, 4096);
            char *y = realloc(x, 40 * MB);
            if (!y || y[100] != 0x5a) _exit(3);
            free(y);
        }
    } else if (pid > 0) {
        forks++;
    }
    errno = saved;
}

static void fork_in_wait(int seconds) {
    grow_while_kicked(fork_when_waiting, 0, 300, seconds, NULL);
    unsigned long ok = 0, killed = 0, lost = 0;
    for (int status; wait(&status) > 0;) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
        else if (WIFSIGNALED(status)) killed++;
        else lost++;
    }
    printf("forks %lu: children ok %lu, killed %lu, lost data %lu\n", forks, ok, killed, lost);
}

static sigjmp_buf back;
static void jump_back(int sig) {
    (void)sig;
    siglongjmp(back, 1);
}

static void alarm_taken(int sig) {
    (void)sig;
    static const char said[] = "SIGALRM taken\n";
    CHECK(write(1, said, sizeof said - 1) == sizeof said - 1);
}

static void jump_out(void) {
    CHECK(signal(SIGSEGV, jump_back) != SIG_ERR && signal(SIGALRM, alarm_taken) != SIG_ERR);
    char *p = malloc(16 * MB);
    CHECK(p);
    memset(p, 1, 16 * MB);
    char *page = (char *)(((uintptr_t)p + 8 * MB) & ~(uintptr_t)4095);
    CHECK(mprotect(page, 4096, PROT_NONE) == 0);
    if (!sigsetjmp(back, 0)) {
        char *q = realloc(p, 64 * MB);
        printf("the realloc did not fault (%p)\n", (void *)q);
    }
    sigset_t now;
    CHECK(pthread_sigmask(SIG_BLOCK, NULL, &now) == 0);
    printf("blocked after the jump: SIGALRM %d SIGTERM %d\n", sigismember(&now, SIGALRM), sigismember(&now, SIGTERM));
    fflush(stdout);
    alarm(1);
    sleep(2);
}

static void edit_the_mask(int sig, siginfo_t *si, void *context) {
    (void)sig, (void)si;
    if (!in_realloc) return;
    sigaddset(&((ucontext_t *)context)->uc_sigmask, SIGUSR2);
    edited = 1;
}

static unsigned long changed, lost_changes;
static void check_the_mask(void) {
    if (!edited) return;
    sigset_t now, usr2;
    CHECK(pthread_sigmask(SIG_BLOCK, NULL, &now) == 0);
    changed++;
    lost_changes += !sigismember(&now, SIGUSR2);
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    CHECK(pthread_sigmask(SIG_UNBLOCK, &usr2, NULL) == 0);
}

static void handler_mask(int seconds) {
    grow_while_kicked(edit_the_mask, SA_RESTART, 200, seconds, check_the_mask);
    printf("handler changed the mask %lu times, lost %lu\n", changed, lost_changes);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    if (!strcmp(argv[1], "fork-in-wait") && argc == 3) fork_in_wait(atoi(argv[2]));
    else if (!strcmp(argv[1], "jump-out")) jump_out();
    else if (!strcmp(argv[1], "handler-mask") && argc == 3) handler_mask(atoi(argv[2]));
    else CHECK(!"usage: handlers_in_our_work fork-in-wait SECONDS | jump-out | handler-mask SECONDS");
    return 0;
}
