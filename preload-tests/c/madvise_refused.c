/* The kernel refuses madvise (a seccomp filter makes it fail): with "free" only MADV_FREE is
 * refused (EINVAL, as on kernels before 4.5) and idle blocks must be released with MADV_DONTNEED
 * instead (their pages leave RSS); with "all" every madvise fails (ENOSYS) and the process must
 * simply carry on, blocks still reused and unmapped later. */
#include "check.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static void refuse_madvise(int only_free) {
    struct sock_filter only[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_FREE, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_filter all[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = only_free ? (struct sock_fprog){sizeof only / sizeof only[0], only}
                                       : (struct sock_fprog){sizeof all / sizeof all[0], all};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
    CHECK(madvise(NULL, 0, MADV_FREE) == -1 && errno == (only_free ? EINVAL : ENOSYS));
}

static int released(uintptr_t unused) {
    (void)unused;
    tm_stats_t s;
    return tm_stats(&s) == 0 && s.host_released_blocks >= 1;
}

static int unmapped(uintptr_t unused) {
    (void)unused;
    tm_stats_t s;
    return tm_stats(&s) == 0 && s.host_cached_bytes == 0 && s.host_unmapped_blocks >= 1;
}

int main(int argc, char **argv) {
    int only_free = argc > 1 && strcmp(argv[1], "free") == 0;
    refuse_madvise(only_free);
    unsigned char *p = malloc(64 * MB);
    CHECK(p);
    memset(p, 7, 64 * MB);
    uintptr_t a = (uintptr_t)p;
    free(p);
    wait_until(released, 0, "the idle block to be released");
    if (only_free) CHECK(smaps_kb(a, "Rss") >= 0 && smaps_kb(a, "Rss") < 1024); /* MADV_DONTNEED took the pages */
    unsigned char *q = malloc(64 * MB); /* reused after the release, whatever it holds */
    CHECK(q);
    memset(q, 9, 64 * MB);
    CHECK(q[12345] == 9);
    free(q);
    wait_until(unmapped, 0, "the idle block to be unmapped");
    puts("madvise refused ok");
    return 0;
}
