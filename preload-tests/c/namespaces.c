/* Moves into namespaces with our background thread running, as sandboxes do: setns into a mount
 * namespace (its own, from /proc/self/ns/mnt), then unshare(CLONE_NEWUSER). The kernel allows
 * both only to a process of one thread (Note [Threads and namespaces] in src/sys/reaper.rs).
 * Large blocks are freed before each, so a thread of ours runs. Prints one line:
 * "setns: RESULT, unshare: RESULT, threads: BEFORE AFTER" (RESULT "ok" or the error; threads from
 * /proc/self/status before the calls and after a large block is freed again). Runs as root. */
#define _GNU_SOURCE
#include "check.h"
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

static void churn(int value) {
    for (int i = 0; i < 2; i++) {
        char *p = malloc(64 * MB);
        CHECK(p);
        memset(p, value, 64 * MB);
        CHECK(p[64 * MB - 1] == (char)value);
        free(p);
    }
}

static const char *result(int rc) {
    return rc == 0 ? "ok" : strerror(errno);
}

int main(void) {
    churn(1);
    int before = thread_count();
    int fd = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    const char *joined = result(setns(fd, CLONE_NEWNS));
    close(fd);
    churn(2);
    const char *unshared = result(unshare(CLONE_NEWUSER));
    churn(3);
    printf("setns: %s, unshare: %s, threads: %d %d\n", joined, unshared, before, thread_count());
    return 0;
}
