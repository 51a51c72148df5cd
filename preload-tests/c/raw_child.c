/* A child made by a raw clone system call (no fork handlers run: bubblewrap's and systemd's
 * namespace children are made so) moves into namespaces at once, with our background thread
 * running in the parent: unshare(0), setns(-1, 0) (EBADF) and capset with the child's own
 * capabilities, each under alarm(5). `raw_child fork` makes the child a copy (SIGCHLD);
 * `raw_child vm` makes it share the parent's memory (CLONE_VM, as posix_spawn's helper and
 * some sandboxes do); `raw_child vm-pidns` in a new pid namespace too. Prints "child: unshare RESULT, setns RESULT, capset RESULT" ("ok" or
 * the error) and then "parent: ok" after a large block is freed and reused again; or "child
 * killed by signal N" (14: it hung). Note [A child's words, not its thread] in
 * src/sys/reaper.rs. */
#define _GNU_SOURCE
#include "check.h"
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern int capset(cap_user_header_t header, const cap_user_data_t data);
extern int capget(cap_user_header_t header, cap_user_data_t data);

static const char *result(int rc) {
    return rc == 0 ? "ok" : strerror(errno);
}

static int child_main(void *unused) {
    (void)unused;
    alarm(5);
    const char *unshared = result(unshare(0));
    const char *joined = result(setns(-1, 0));
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    CHECK(capget(&header, data) == 0);
    const char *capped = result(capset(&header, data));
    /* One line, written whole: the child shares nothing of stdio's with the parent it can use. */
    char line[256];
    int n = snprintf(line, sizeof line, "child: unshare %s, setns %s, capset %s\n", unshared, joined, capped);
    CHECK(write(1, line, (size_t)n) == n);
    return 0;
}

int main(int argc, char **argv) {
    /* vm-pidns: the child also gets a pid namespace of its own, where it is pid 1, as its
     * parent is in its own (run under `unshare -p -f`). */
    int new_pid_ns = argc > 1 && strcmp(argv[1], "vm-pidns") == 0;
    int shared = new_pid_ns || (argc > 1 && strcmp(argv[1], "vm") == 0);
    churn_large(3, 8 * MB, 1);
    fflush(stdout);
    pid_t pid;
    static char stack[256 << 10];
    if (shared) {
        pid = clone(child_main, stack + sizeof stack, CLONE_VM | SIGCHLD | (new_pid_ns ? CLONE_NEWPID : 0), NULL);
    } else {
        pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) _exit(child_main(NULL));
    }
    CHECK(pid > 0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status)) {
        printf("child killed by signal %d\n", WTERMSIG(status));
        return 0;
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's allocator is as it was: its thread still releases, its cache still serves. */
    churn_large(3, 8 * MB, 2);
    printf("parent: ok\n");
    return 0;
}
