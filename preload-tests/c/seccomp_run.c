/* Runs a program under a seccomp filter, as systemd's SystemCallFilter= or a browser's sandbox
 * would: `seccomp_run allow|kill|eagain NR,NR,... PROGRAM [ARGS...]`. `allow`: only the listed
 * system calls are allowed, every other one kills the process (SECCOMP_RET_KILL_PROCESS, SIGSYS);
 * `kill`: the listed calls kill it, every other one is allowed; `eagain`: the listed calls fail
 * with EAGAIN (as clone does under RLIMIT_NPROC or a pids cgroup at its limit), every other one
 * is allowed. Numbers are x86-64 system call
 * numbers (test_footprint.py turns names into them); calls of other ABIs (x32, i386) kill. The
 * filter is installed with no_new_privs, then PROGRAM is exec'd under it. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_CALLS 1024

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "allow") != 0 && strcmp(argv[1], "kill") != 0 && strcmp(argv[1], "eagain") != 0)) {
        fprintf(stderr, "usage: seccomp_run allow|kill|eagain NR,NR,... PROGRAM [ARGS...]\n");
        return 2;
    }
    int allow = strcmp(argv[1], "allow") == 0, eagain = strcmp(argv[1], "eagain") == 0;
    static long nrs[MAX_CALLS];
    int n = 0;
    for (char *s = argv[2]; *s && n < MAX_CALLS;) {
        char *end;
        long nr = strtol(s, &end, 10);
        if (end == s) break;
        nrs[n++] = nr;
        s = *end == ',' ? end + 1 : end;
    }
    unsigned listed = allow ? SECCOMP_RET_ALLOW : eagain ? SECCOMP_RET_ERRNO | EAGAIN : SECCOMP_RET_KILL_PROCESS;
    unsigned other = allow ? SECCOMP_RET_KILL_PROCESS : SECCOMP_RET_ALLOW;
    static struct sock_filter f[4 + 2 * MAX_CALLS + 1];
    int k = 0;
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    /* x32 calls have bit 30 set: no listed number has it, so they take `other`; in allow mode
     * that kills. In kill mode an x32 alias of a listed call would escape: none is used here. */
    for (int i = 0; i < n; i++) {
        f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nrs[i], 0, 1);
        f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, listed);
    }
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, other);
    struct sock_fprog prog = {(unsigned short)k, f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        perror("seccomp_run: no_new_privs");
        return 3;
    }
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
        perror("seccomp_run: seccomp");
        return 3;
    }
    execv(argv[3], argv + 3);
    perror("seccomp_run: exec");
    return 127;
}
