/* Forks while our background thread is in a pass: a thread frees large blocks so that the thread
 * wakes all the time (TENSORMALLOC_HOST_RELEASE_MS=1), and every pass looks at the device pools
 * and, under TENSORMALLOC_STATS=json, rewrites the numbers. Each child asks for the stats and
 * for a large block of its own, then exits: a lock the background thread held at the fork must
 * not be held for good in the child, which has no such thread. A child that has not exited
 * within 10 s is counted hung and killed. `fork_mid_pass [FORKS] [raw]` (default 10000); with
 * `raw` the children are made by the fork system call itself, which runs no fork handler (as
 * bubblewrap's and systemd's raw clones do; Note [Children our handlers did not see]): the
 * churning thread, not only ours, may then hold our cache lock at the fork; each such child
 * forks a child of its own (with fork()) before anything else. Prints
 * "forks N hung H failed F". */
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static volatile int stop;

static void *churn(void *arg) {
    (void)arg;
    while (!stop) {
        char *p = malloc(4 * MB);
        CHECK(p);
        p[0] = 1;
        free(p);
    }
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The child's exit status, or -1 when it has not exited within `seconds` (it is then killed). */
static int wait_bounded(pid_t pid, double seconds) {
    double deadline = now_s() + seconds;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 10000;
    int raw = argc > 2 && strcmp(argv[2], "raw") == 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, churn, NULL) == 0);
    int hung = 0, failed = 0;
    for (int i = 0; i < forks; i++) {
        fflush(NULL);
        pid_t pid = raw ? (pid_t)syscall(SYS_fork) : fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            if (raw) {
                /* Forked in turn before anything else: our prepare handler then runs in a child
                 * whose records are its parent's. */
                pid_t g = fork();
                if (g < 0) _exit(4);
                if (g == 0) _exit(0);
                if (waitpid(g, NULL, 0) != g) _exit(5);
            }
            tm_stats_t s;
            tm_stats(&s);
            char *p = malloc(8 * MB);
            if (!p) _exit(2);
            p[0] = 7;
            free(p);
            _exit(0);
        }
        int rc = wait_bounded(pid, 10.0);
        if (rc == -1) {
            fprintf(stderr, "fork %d: the child hung\n", i);
            hung++;
        } else if (rc != 0) {
            fprintf(stderr, "fork %d: the child ended with %d\n", i, rc);
            failed++;
        }
        if (hung + failed >= 3) break;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("forks %d hung %d failed %d\n", forks, hung, failed);
    return hung || failed;
}
