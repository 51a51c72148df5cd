/* Part of a block advised MADV_DONTFORK: a forked child has the block with a hole (Note [A block
 * the child has in part]). The child maps memory of its own in the hole, then frees the block:
 * its own mapping must stay (the old library recorded the block at its whole length, took the
 * hole for its own and unmapped the child's mapping with the block, so the next read of it
 * faulted), and under the library the child's stats count what it has of the block, no more.
 * Beside glibc alone the free unmaps the whole chunk, the hole's new owner with it, so the
 * mapping's check is ours only. Prints "fork kept part ok". */
#include "check.h"
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK (16 * MB)
#define PAGE 4096UL

int main(void) {
    char *block = malloc(BLOCK);
    CHECK(block);
    memset(block, 1, BLOCK);
    uintptr_t start = ((uintptr_t)block + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    uintptr_t hole = start + 4 * MB;
    size_t hole_len = 4 * MB;
    CHECK(madvise((void *)hole, hole_len, MADV_DONTFORK) == 0);
    tm_stats_t before = {.size = sizeof before};
    int ours = tm_stats(&before) == 0 && before.enabled;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char *mine = mmap((void *)hole, hole_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(mine == (char *)hole);
        memset(mine, 0x55, hole_len);
        CHECK(block[0] == 1 && ((char *)start)[4 * MB - 1] == 1);
        if (ours) {
            tm_stats_t s = {.size = sizeof s};
            CHECK(tm_stats(&s) == 0);
            /* What is left of the block: the pages before its hole. */
            CHECK(s.host_live_bytes <= before.host_live_bytes - (BLOCK - 4 * MB - PAGE));
        }
        free(block);
        if (ours) {
            for (size_t i = 0; i < hole_len; i += PAGE) CHECK(mine[i] == 0x55);
            tm_stats_t s = {.size = sizeof s};
            CHECK(tm_stats(&s) == 0 && s.host_live_bytes + BLOCK <= before.host_live_bytes + PAGE);
        }
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("child: %s %d\n", WIFSIGNALED(status) ? "signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        CHECK(!"the child failed");
    }
    free(block);
    printf("fork kept part ok\n");
    return 0;
}
