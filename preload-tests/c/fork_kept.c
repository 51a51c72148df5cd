/* A block the program advised MADV_DONTFORK is not in a forked child (the CUDA driver does this
 * to host memory it pins). The child maps memory of its own where the block was, then frees a
 * large block of its own and allocates again: the new block is never the child's own mapping
 * (which would happen if its stale record were taken for a block to reuse), and under the
 * library the child's stats count the missing block no more. Prints "fork kept ok". */
#include "check.h"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK (8 * MB)
#define PAGE 4096UL

int main(void) {
    char *kept = malloc(BLOCK);
    CHECK(kept);
    memset(kept, 1, BLOCK);
    uintptr_t lo = ((uintptr_t)kept + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    size_t len = (((uintptr_t)kept + BLOCK) & ~(uintptr_t)(PAGE - 1)) - lo;
    CHECK(madvise((void *)lo, len, MADV_DONTFORK) == 0);
    tm_stats_t before = {.size = sizeof before};
    int ours = tm_stats(&before) == 0 && before.enabled;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* The child's own memory where the block was: shared, so that a reuse of it as a
         * malloc block would be visible. */
        char *mine = mmap((void *)lo, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(mine == (char *)lo);
        memset(mine, 0x55, len);
        if (ours) {
            tm_stats_t s = {.size = sizeof s};
            CHECK(tm_stats(&s) == 0);
            CHECK(s.host_live_bytes + BLOCK <= before.host_live_bytes);
        }
        for (int i = 0; i < 20; i++) {
            char *p = malloc(BLOCK);
            CHECK(p);
            CHECK((uintptr_t)p + BLOCK <= lo || (uintptr_t)p >= lo + len);
            memset(p, 2, BLOCK);
            free(p);
        }
        for (size_t i = 0; i < len; i += PAGE) CHECK(mine[i] == 0x55);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    free(kept);
    printf("fork kept ok\n");
    return 0;
}
