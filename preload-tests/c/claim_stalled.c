/* claim_stalled [release|unmap|beside]: a mapping of the program's own over a freed block while
 * our thread's work on that block is stalled (the test holds it with c/hold_our_thread.c).
 * `release` (Note [Ranges the program claims]): frees a 64 MiB block, waits 1.5 s (its idle
 * release is due at 1 s; the test holds our thread at that release's madvise), then maps pages
 * of its own over the block's addresses with mmap(MAP_FIXED), as glibc's free left them the
 * kernel's, fills them and checks them for 10 s. The old library's mmap gave up waiting after
 * 5 s; the stalled release then madvised and unmapped the program's own pages (SIGSEGV).
 * `unmap` (Note [Ranges in transit]): the same, our thread held at the munmap that expires the
 * block (the test sets the unmap delay short); the old library gave up after 5 s and its late
 * munmap took the program's pages.
 * `beside`: our thread held at that munmap, the program unmaps the last 2 MiB of another block
 * of its own, a live one; nothing of ours is on its way to the kernel there, and the old
 * library's munmap waited 5 s for the range elsewhere. Prints "claim stalled ok". Each frees its
 * block once a line comes on stdin: the test sends it when the tracer is attached. */
#include "check.h"
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void segv(int sig, siginfo_t *info, void *ctx) {
    (void)sig, (void)ctx;
    char b[128];
    int n = snprintf(b, sizeof b, "SIGSEGV at %p: the program's own mapping is gone\n", info->si_addr);
    (void)!write(1, b, n);
    _exit(3);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "release";
    /* The tracer is not our parent: let it attach under Yama's ptrace_scope 1. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    struct sigaction sa = {.sa_sigaction = segv, .sa_flags = SA_SIGINFO};
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
    size_t len = 64 * MB;
    unsigned char *kept = malloc(len), *x = malloc(len);
    CHECK(kept && x);
    memset(kept, 2, len);
    memset(x, 1, len);
    /* A block freed first starts our thread, for the tracer to find (under 32 MiB: not held). */
    unsigned char *starter = malloc(8 * MB);
    CHECK(starter);
    memset(starter, 3, 8 * MB);
    free(starter);
    printf("ready\n");
    fflush(stdout);
    char go[8];
    CHECK(fgets(go, sizeof go, stdin) != NULL); /* the tracer holds our thread from here on */
    free(x);
    double t0 = now_s();
    usleep(1500000);
    double s = now_s();
    if (!strcmp(mode, "beside")) {
        unsigned char *tail = (unsigned char *)(((uintptr_t)kept + len - 2 * MB) & ~(uintptr_t)4095);
        CHECK(munmap(tail, 2 * MB) == 0);
        printf("munmap beside the stalled unmap took %.2f s\n", now_s() - s);
        for (unsigned char *q = kept; q < tail; q += 4096) CHECK(*q == 2);
        printf("claim stalled ok\n");
        return 0;
    }
    unsigned char *p = mmap((void *)((uintptr_t)x & ~(uintptr_t)4095), len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    printf("mmap(MAP_FIXED) over the freed block took %.2f s\n", now_s() - s);
    fflush(stdout);
    memset(p, 0xab, len);
    while (now_s() - t0 < 12) {
        for (size_t k = 0; k < len; k += 4096) CHECK(p[k] == 0xab);
        usleep(250000);
    }
    printf("claim stalled ok\n");
    return 0;
}
