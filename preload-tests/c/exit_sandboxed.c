/* A program that locks itself down once set up (as privilege-separated daemons and browsers'
 * renderers do): after some small mallocs it installs a seccomp filter that kills the process on
 * mmap and mprotect, then returns from main. glibc's exit makes neither call; a library that
 * asks for nothing at exit must not either. `exit_sandboxed [large]`: with `large`, a 64 MiB
 * block is malloc'd, written and freed first (before the filter). Prints "sandboxed exit" just
 * before returning. */
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    void *small[64];
    for (int i = 0; i < 64; i++) small[i] = malloc(100 + i * 37);
    for (int i = 0; i < 64; i++) free(small[i]);
    if (argc > 1 && strcmp(argv[1], "large") == 0) {
        char *big = malloc(64 << 20);
        if (!big) return 2;
        memset(big, 1, 64 << 20);
        free(big);
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {sizeof filter / sizeof *filter, filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("seccomp");
        return 3;
    }
    printf("sandboxed exit\n");
    fflush(stdout);
    return 0;
}
