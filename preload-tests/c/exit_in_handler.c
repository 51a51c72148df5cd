/* A timer handler that ends the program with exit() (not async-signal-safe, but glibc alone gets
 * through it, and it is common: a SIGTERM or SIGALRM handler that runs the atexit cleanups),
 * while the main thread allocates and frees large blocks: the signal lands inside our calls
 * most of the time (Note [Exit from inside our work] in src/shim/lifecycle.rs). argv[1]: the
 * timer's period in microseconds. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t ticks;

static void on_tick(int sig) {
    (void)sig;
    if (++ticks == 20) exit(0);
}

int main(int argc, char **argv) {
    long period = argc > 1 ? atol(argv[1]) : 1000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_tick;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, period}, {0, period}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (long i = 0;; i++) {
        /* Two lengths in turn: a block asked for again at its own length comes back from the
         * thread's slot with no lock held (Note [A thread's own slot]); this asks the cache. */
        char *volatile p = malloc(((size_t)(i % 2 ? 6 : 4) << 20) + (size_t)(i % 32) * 65536);
        p[0] = 1;
        free(p);
    }
}
