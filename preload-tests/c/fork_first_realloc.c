/* A forked child whose first large event is a realloc (or, with "free", a free) of a block it
 * inherited, then SIGTERM to itself: the child dies by it, as under glibc alone. Prints what the
 * child's mask held after the call and how the child ended. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int blocked(int s) {
    sigset_t m;
    sigprocmask(SIG_BLOCK, NULL, &m);
    return sigismember(&m, s);
}

int main(int argc, char **argv) {
    int use_free = argc > 1 && strcmp(argv[1], "free") == 0;
    char *p = malloc(64 << 20);
    if (!p) return 1;
    memset(p, 1, 1 << 20);
    pid_t pid = fork();
    if (pid == 0) {
        if (use_free) free(p);
        else p = realloc(p, 200 << 20);
        printf("child: SIGTERM blocked=%d\n", blocked(SIGTERM));
        fflush(stdout);
        kill(getpid(), SIGTERM);
        printf("child survived its own SIGTERM\n");
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) printf("child killed by signal %d\n", WTERMSIG(st));
    else printf("child exited %d\n", WEXITSTATUS(st));
    return 0;
}
