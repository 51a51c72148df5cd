/* fork() while idle blocks are being released (issue 19, case 2): each round the parent writes
 * and frees 6 x 64 MiB, then forks every few ms for twice TENSORMALLOC_HOST_RELEASE_MS (at least
 * 20 ms), so that some forks land while the background thread is releasing the blocks. Each
 * child reads its RssAnon right after the fork and after tm_trim() (through dlsym, so the
 * program also runs without the library; then its cache must be empty); the last child of a
 * round also allocates, writes and frees large blocks of its own and trims again. After a trim
 * the child waits (bounded) for RssAnon to come within 16 MiB of the parent's at the start:
 * tm_trim leaves a block the background thread is releasing to be unmapped when its madvise
 * returns. Prints the largest of each figure over all children ("max child RssAnon kB:
 * after-fork N after-trim N after-own-blocks N"), for the test to compare with a run under
 * glibc alone, then "fork release ok". `fork_release [ROUNDS]` (default 4). */
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define BLOCKS 6
#define SIZE (64 * MB)
#define FORKS 21

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* RssAnon once it is at most limit_kb, polling for up to 2 s: a block the background thread
 * is releasing when tm_trim() runs is unmapped only when its madvise returns. */
static long settled_rss_kb(long limit_kb) {
    long kb = status_kb("RssAnon");
    for (int i = 0; i < 400 && kb > limit_kb; i++) {
        sleep_ms(5);
        kb = status_kb("RssAnon");
    }
    return kb;
}

static long baseline_kb;

/* The child: its figures go back through the pipe; exit 0 when everything worked. */
static void child(int fd, int own) {
    long fig[3];
    fig[0] = status_kb("RssAnon");
    size_t (*trim)(void) = (size_t (*)(void))dlsym(RTLD_DEFAULT, "tm_trim");
    tm_stats_t s;
    int ours = tm_stats(&s) == 0 && s.enabled;
    if (trim) trim();
    fig[1] = settled_rss_kb(baseline_kb + 16 * 1024);
    if (ours) {
        CHECK(tm_stats(&s) == 0);
        if (s.host_cached_bytes != 0 || s.host_cached_blocks != 0) {
            fprintf(stderr, "child: after tm_trim the cache still holds %llu blocks, %llu bytes\n",
                    (unsigned long long)s.host_cached_blocks, (unsigned long long)s.host_cached_bytes);
            _exit(1);
        }
    }
    fig[2] = -1;
    for (int k = 0; k < 2 * own; k++) {
        unsigned char *p[3];
        for (int i = 0; i < 3; i++) {
            p[i] = malloc(SIZE - i * MB);
            CHECK(p[i]);
            fill(p[i], SIZE - i * MB, 20 + i);
        }
        for (int i = 0; i < 3; i++) {
            CHECK(filled(p[i], SIZE - i * MB, 20 + i));
            free(p[i]);
        }
    }
    if (own) {
        if (trim) trim();
        fig[2] = settled_rss_kb(baseline_kb + 16 * 1024);
    }
    CHECK(write(fd, fig, sizeof fig) == sizeof fig);
    _exit(0);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    long release_ms = (long)env_size("TENSORMALLOC_HOST_RELEASE_MS", 50);
    double window_ms = 2.0 * release_ms < 20 ? 20 : 2.0 * release_ms;
    long worst[3] = {-1, -1, -1};
    int failed = 0;
    baseline_kb = status_kb("RssAnon");
    for (int r = 0; r < rounds; r++) {
        unsigned char *p[BLOCKS];
        for (int i = 0; i < BLOCKS; i++) {
            p[i] = malloc(SIZE);
            CHECK(p[i]);
            fill(p[i], SIZE, r + i);
        }
        for (int i = 0; i < BLOCKS; i++) free(p[i]);
        double t0 = now_ms();
        pid_t pid[FORKS];
        int fd[FORKS];
        double at[FORKS];
        for (int k = 0; k < FORKS; k++) {
            double due = t0 + window_ms * k / (FORKS - 1), t = now_ms();
            if (due > t) sleep_ms((long)(due - t));
            int fds[2];
            CHECK(pipe(fds) == 0);
            fflush(NULL);
            at[k] = now_ms() - t0;
            pid[k] = fork();
            CHECK(pid[k] >= 0);
            if (pid[k] == 0) {
                close(fds[0]);
                child(fds[1], k == FORKS - 1);
            }
            close(fds[1]);
            fd[k] = fds[0];
        }
        long round_worst[3] = {-1, -1, -1};
        for (int k = 0; k < FORKS; k++) {
            long fig[3] = {-1, -1, -1};
            ssize_t got = read(fd[k], fig, sizeof fig);
            close(fd[k]);
            int status = 0;
            CHECK(waitpid(pid[k], &status, 0) == pid[k]);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != (ssize_t)sizeof fig) {
                fprintf(stderr, "round %d, fork %.0f ms after the frees: child %s %d\n", r, at[k],
                        WIFSIGNALED(status) ? "killed by signal" : "exited", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
                failed++;
                continue;
            }
            if (fig[1] > 16 * 1024 + baseline_kb)
                printf("round %d, fork %.0f ms after the frees: child RssAnon %ld kB after tm_trim\n", r, at[k], fig[1]);
            for (int i = 0; i < 3; i++)
                if (fig[i] > round_worst[i]) round_worst[i] = fig[i];
        }
        printf("round %d: %d forks over %.0f ms: max child RssAnon kB after fork %ld, after trim %ld, after its own blocks %ld\n",
               r, FORKS, window_ms, round_worst[0], round_worst[1], round_worst[2]);
        for (int i = 0; i < 3; i++)
            if (round_worst[i] > worst[i]) worst[i] = round_worst[i];
    }
    printf("max child RssAnon kB: after-fork %ld after-trim %ld after-own-blocks %ld\n", worst[0], worst[1], worst[2]);
    if (failed) {
        fprintf(stderr, "%d children failed\n", failed);
        return 1;
    }
    puts("fork release ok");
    return 0;
}
