/* hold_our_thread PID SECONDS [madvise|munmap]: attaches to PID's thread named "tensormalloc*"
 * with ptrace and, at its first madvise (or munmap) of 32 MiB or more, keeps it stopped there
 * SECONDS, then lets it go: a release or an unmap stalled as a starved or traced thread stalls
 * (c/claim_stalled.c). x86-64 only.
 * Prints "held" once it let the thread go; exits 2 when ptrace is refused (a sandbox). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int our_thread(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int tid = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char comm_path[128], comm[32] = {0};
        snprintf(comm_path, sizeof comm_path, "/proc/%d/task/%s/comm", pid, e->d_name);
        FILE *f = fopen(comm_path, "r");
        if (f) {
            if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
            fclose(f);
        }
        if (!strncmp(comm, "tensormalloc", 12)) tid = atoi(e->d_name);
    }
    closedir(d);
    return tid;
}

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    int pid = atoi(argv[1]);
    double hold = atof(argv[2]);
    long call = argc > 3 && !strcmp(argv[3], "munmap") ? SYS_munmap : SYS_madvise;
    int tid = 0;
    double t0 = now_s();
    while (!(tid = our_thread(pid)) && now_s() - t0 < 5) usleep(2000);
    if (tid <= 0) {
        fprintf(stderr, "hold_our_thread: no thread of ours in %d\n", pid);
        return 1;
    }
    if (ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACESYSGOOD) != 0) {
        fprintf(stderr, "hold_our_thread: ptrace refused: %s\n", strerror(errno));
        return 2;
    }
    ptrace(PTRACE_INTERRUPT, tid, 0, 0);
    int st;
    waitpid(tid, &st, __WALL);
    printf("attached\n"); /* the program may go on: every call of our thread is seen from here */
    fflush(stdout);
    int entering = 0;
    for (;;) {
        if (ptrace(PTRACE_SYSCALL, tid, 0, 0) != 0) return 1;
        if (waitpid(tid, &st, __WALL) != tid || WIFEXITED(st) || WIFSIGNALED(st)) return 1;
        if (!WIFSTOPPED(st) || WSTOPSIG(st) != (SIGTRAP | 0x80)) continue;
        entering = !entering;
        if (!entering) continue;
        struct user_regs_struct r;
        ptrace(PTRACE_GETREGS, tid, 0, &r);
        if ((long)r.orig_rax == call && r.rsi >= (32ul << 20)) {
            double h0 = now_s();
            while (now_s() - h0 < hold) usleep(10000);
            ptrace(PTRACE_DETACH, tid, 0, 0);
            printf("held\n");
            return 0;
        }
    }
}
