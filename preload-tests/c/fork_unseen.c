/* A child made without fork handlers (Note [Children our handlers did not see]): a 64 MiB block
 * is written and freed, a fork() keeps it from children while it stays cached, then the child is
 * made by `_Fork()` or the fork system call itself (`fork_unseen fork|raw`). The child maps
 * 66 MiB of its own (the kernel puts it where the kept block was, which the child does not
 * have), fills it, and asks malloc for 64 MiB: the block it gets must not overlap its own
 * mapping, whose bytes must all be intact after the block is written; malloc_trim must leave the
 * mapping alone too. Prints "child ok" or what went wrong. */
#define _GNU_SOURCE
#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

extern pid_t _Fork(void);

#define SIZE (64 * MB)
#define OWN (SIZE + 2 * MB)

static int intact(const unsigned char *q) {
    for (size_t i = 0; i < OWN; i += 4096)
        if (q[i] != 5) return 0;
    return 1;
}

int main(int argc, char **argv) {
    int raw = argc > 1 && strcmp(argv[1], "raw") == 0;
    unsigned char *p = malloc(SIZE);
    CHECK(p);
    memset(p, 1, SIZE);
    free(p);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) _exit(0);
    CHECK(waitpid(c, NULL, 0) == c);
    fflush(stdout);
    pid_t pid = raw ? (pid_t)syscall(SYS_fork) : _Fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        unsigned char *q = mmap(NULL, OWN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(q != MAP_FAILED);
        memset(q, 5, OWN);
        unsigned char *r = malloc(SIZE);
        CHECK(r);
        int overlap = r < q + OWN && q < r + SIZE;
        memset(r, 3, SIZE);
        int kept = intact(q);
        free(r);
        malloc_trim(0);
        int after_trim = intact(q);
        printf("own mapping %p, malloc %p: overlap %d, intact %d, intact after trim %d\n", (void *)q, (void *)r, overlap, kept, after_trim);
        puts(!overlap && kept && after_trim ? "child ok" : "child's own memory was handed out or unmapped");
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}
