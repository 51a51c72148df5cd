/* Pages the program puts where a freed block was (as in claimed.c), in a forked child whose
 * first child fork handler, another library's (fork_prelib.cc), allocates before ours runs:
 * in the parent, the child, the child 0.3 s later, a new thread of the child and the child's
 * main thread again. Each: a 16 MiB block written and freed, 2 MiB of the program's own mapped
 * (MAP_FIXED) inside where it was and written; the next malloc(16 MiB) is written, and the
 * program's pages must be intact. Prints "fork claim ok". */
#define _GNU_SOURCE
#include "check.h"
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int fork_prelib_loaded(void);

#define BLOCK (16 * MB)

static int own_pages_survive(const char *who) {
    unsigned char *p = malloc(BLOCK);
    CHECK(p);
    memset(p, 1, BLOCK);
    free(p);
    unsigned char *at = (unsigned char *)(((uintptr_t)p + 2 * MB) & ~4095UL);
    unsigned char *q = mmap(at, 2 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(q == at);
    memset(q, 0x42, 2 * MB);
    unsigned char *r = malloc(BLOCK);
    CHECK(r);
    memset(r, 7, BLOCK);
    int ok = 1;
    for (size_t i = 0; i < 2 * MB; i += 4096)
        if (q[i] != 0x42) ok = 0;
    if (!ok) fprintf(stderr, "FAIL %s: the next block overwrote the program's own pages\n", who);
    free(r);
    munmap(q, 2 * MB);
    return ok;
}

static void *in_thread(void *arg) {
    (void)arg;
    return own_pages_survive("a new thread of the child") ? (void *)1 : NULL;
}

int main(void) {
    /* glibc's threshold would rise past 16 MiB after the handler's 32 MiB block: glibc alone
     * would then keep the block in its heap, which the program must not map over. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    CHECK(fork_prelib_loaded());
    CHECK(own_pages_survive("the parent"));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int ok = own_pages_survive("the child");
        usleep(300 * 1000);
        ok &= own_pages_survive("the child, 0.3 s later");
        pthread_t t;
        void *r;
        CHECK(pthread_create(&t, NULL, in_thread, NULL) == 0);
        pthread_join(t, &r);
        ok &= r != NULL;
        ok &= own_pages_survive("the child's main thread again");
        _exit(ok ? 0 : 1);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(own_pages_survive("the parent after the fork"));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("fork claim ok\n");
    return 0;
}
