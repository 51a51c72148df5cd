/* A block the program advised MADV_DONTFORK, wholly or in part, is not in a forked child, or
 * only in part (the CUDA driver does this to host memory it pins). Usage: fork_kept [part].
 *   (none) The whole block is kept from the child. The child maps memory of its own where the
 *          block was, then frees a large block of its own and allocates again: the new block is
 *          never the child's own mapping (which would happen if its stale record were taken for
 *          a block to reuse), and under the library the child's stats count the missing block
 *          no more. Prints "fork kept ok".
 *   part   4 MiB in the middle of a 16 MiB block is kept from the child (Note [A block the child
 *          has in part]). The child maps memory of its own in the hole, then frees the block:
 *          its own mapping must stay (the old library recorded the block at its whole length,
 *          took the hole for its own and unmapped the child's mapping with the block, so the
 *          next read of it faulted), and under the library the child's stats count what it has
 *          of the block, no more. Beside glibc alone the free unmaps the whole chunk, the hole's
 *          new owner with it, so the mapping's check is ours only. Prints "fork kept part ok". */
#include "check.h"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096UL

/* The child's side of the whole block kept from it ([lo, lo+len) was the block). */
static void child_without_the_block(uintptr_t lo, size_t len, size_t block, int ours, const tm_stats_t *before) {
    /* The child's own memory where the block was: shared, so that a reuse of it as a malloc
     * block would be visible. */
    char *mine = mmap((void *)lo, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(mine == (char *)lo);
    memset(mine, 0x55, len);
    if (ours) {
        tm_stats_t s = {.size = sizeof s};
        CHECK(tm_stats(&s) == 0);
        CHECK(s.host_live_bytes + block <= before->host_live_bytes);
    }
    for (int i = 0; i < 20; i++) {
        char *p = malloc(block);
        CHECK(p);
        CHECK((uintptr_t)p + block <= lo || (uintptr_t)p >= lo + len);
        memset(p, 2, block);
        free(p);
    }
    for (size_t i = 0; i < len; i += PAGE) CHECK(mine[i] == 0x55);
}

/* The child's side of the block with a hole at [hole, hole+hole_len). */
static void child_with_a_hole(char *block, size_t block_len, uintptr_t start, uintptr_t hole, size_t hole_len, int ours, const tm_stats_t *before) {
    char *mine = mmap((void *)hole, hole_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(mine == (char *)hole);
    memset(mine, 0x55, hole_len);
    CHECK(block[0] == 1 && ((char *)start)[hole - start - 1] == 1);
    if (ours) {
        tm_stats_t s = {.size = sizeof s};
        CHECK(tm_stats(&s) == 0);
        /* What is left of the block: the pages before its hole. */
        CHECK(s.host_live_bytes <= before->host_live_bytes - (block_len - (hole - start) - PAGE));
    }
    free(block);
    if (ours) {
        for (size_t i = 0; i < hole_len; i += PAGE) CHECK(mine[i] == 0x55);
        tm_stats_t s = {.size = sizeof s};
        CHECK(tm_stats(&s) == 0 && s.host_live_bytes + block_len <= before->host_live_bytes + PAGE);
    }
}

int main(int argc, char **argv) {
    int part = argc > 1 && !strcmp(argv[1], "part");
    size_t block_len = part ? 16 * MB : 8 * MB;
    char *block = malloc(block_len);
    CHECK(block);
    memset(block, 1, block_len);
    uintptr_t start = ((uintptr_t)block + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    /* Kept from children: the whole block's pages, or 4 MiB after its first 4. */
    uintptr_t lo = part ? start + 4 * MB : start;
    size_t len = part ? 4 * MB : (((uintptr_t)block + block_len) & ~(uintptr_t)(PAGE - 1)) - lo;
    CHECK(madvise((void *)lo, len, MADV_DONTFORK) == 0);
    tm_stats_t before = {.size = sizeof before};
    int ours = tm_stats(&before) == 0 && before.enabled;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (part) {
            child_with_a_hole(block, block_len, start, lo, len, ours, &before);
        } else {
            child_without_the_block(lo, len, block_len, ours, &before);
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
    printf(part ? "fork kept part ok\n" : "fork kept ok\n");
    return 0;
}
