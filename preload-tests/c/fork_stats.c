/* A parent makes PARENT large requests, forks a child that makes CHILD more and exits through
 * exit(): under TENSORMALLOC_STATS=json:...%p each leaves its own file, the child's with its own
 * numbers (issue 30, item 2). Prints both pids. */
#include "check.h"
#include <sys/wait.h>
#include <unistd.h>

static void requests(int n) {
    for (int i = 0; i < n; i++) {
        char *p = malloc(8 * MB);
        CHECK(p);
        p[0] = 1;
        free(p);
    }
}

int main(void) {
    requests(10);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        requests(3);
        exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("parent %d child %d\n", (int)getpid(), (int)pid);
    return 0;
}
