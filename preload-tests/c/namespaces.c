/* Moves into namespaces with our background thread running, as sandboxes do: setns into a mount
 * namespace (its own, from /proc/self/ns/mnt), then unshare(CLONE_NEWUSER). The kernel allows
 * both only to a process of one thread (Note [Threads and namespaces] in src/sys/reaper.rs).
 * Large blocks are freed before each, so a thread of ours runs. Prints one line:
 * "setns: RESULT, unshare: RESULT, threads: BEFORE AFTER" (RESULT "ok" or the error; threads from
 * /proc/self/status before the calls and after a large block is freed again). Runs as root.
 * With the argument "traced" the same runs in a child this process traces, which keeps each
 * ended thread in the thread group 20 ms before it lets the kernel release it, as a debugger or a
 * busy machine may: our thread, joined, is not yet gone (Note [Joined is not gone] in
 * src/sys/thread.rs). */
#define _GNU_SOURCE
#include "check.h"
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *result(int rc) {
    return rc == 0 ? "ok" : strerror(errno);
}

/* After a refusal: each thread of this process now, as "TID:STATE" from /proc/self/task (a
 * thread held after its end shows Z or t), so a failure says what the kernel still counted. */
static void print_tasks(const char *call, int rc) {
    if (rc == 0) return;
    printf("%s refused; tasks now:", call);
    DIR *d = opendir("/proc/self/task");
    CHECK(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[64], stat[512] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(stat, sizeof stat, f)) {
            const char *end = strrchr(stat, ')');
            printf(" %s:%c", e->d_name, end && end[1] == ' ' ? end[2] : '?');
        }
        if (f) fclose(f);
    }
    closedir(d);
    printf("\n");
}

static int scenario(void) {
    churn_large(2, 64 * MB, 1);
    int before = thread_count();
    int fd = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    errno = 1234; /* a success leaves errno as it was (under glibc alone too) */
    int setns_rc = setns(fd, CLONE_NEWNS);
    CHECK(setns_rc != 0 || errno == 1234);
    const char *joined = result(setns_rc);
    print_tasks("setns", setns_rc);
    close(fd);
    churn_large(2, 64 * MB, 2);
    errno = 1234;
    int unshare_rc = unshare(CLONE_NEWUSER);
    CHECK(unshare_rc != 0 || errno == 1234);
    const char *unshared = result(unshare_rc);
    print_tasks("unshare", unshare_rc);
    churn_large(2, 64 * MB, 3);
    printf("setns: %s, unshare: %s, threads: %d %d\n", joined, unshared, before, thread_count());
    return 0;
}

/* Traces `child` (stopped, asked to be traced) and its threads until it exits: each thread that
 * ends is released 20 ms after it ended; every other stop is resumed as it came. */
static int trace(pid_t child) {
    int status;
    CHECK(waitpid(child, &status, 0) == child);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    CHECK(WIFSTOPPED(status));
    CHECK(ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_TRACECLONE | PTRACE_O_EXITKILL) == 0);
    CHECK(ptrace(PTRACE_CONT, child, 0, 0) == 0);
    for (;;) {
        siginfo_t info = {0};
        CHECK(waitid(P_ALL, 0, &info, WEXITED | WSTOPPED | WNOWAIT | __WALL) == 0);
        pid_t tid = info.si_pid;
        int ended = info.si_code == CLD_EXITED || info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
        if (ended && tid != child) usleep(20000);
        CHECK(waitpid(tid, &status, __WALL) == tid);
        if (tid == child && (WIFEXITED(status) || WIFSIGNALED(status)))
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (!WIFSTOPPED(status)) continue;
        int sig = WSTOPSIG(status);
        /* A clone event, or a new thread's first stop: not the program's signals. */
        int ours = (status >> 16) != 0 || sig == SIGSTOP || sig == SIGTRAP;
        ptrace(PTRACE_CONT, tid, 0, ours ? 0 : sig);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "traced") != 0) return scenario();
    fflush(stdout);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) != 0) {
            printf("ptrace refused: %s\n", strerror(errno));
            exit(77);
        }
        raise(SIGSTOP);
        exit(scenario());
    }
    return trace(child);
}
