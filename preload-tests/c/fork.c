/* fork() from a multi-threaded process whose cache is not empty; the child allocates (small and
 * large, reusing cached blocks) and exits; threads keep allocating across the forks. */
#include "check.h"
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int stop;

static void *churn(void *arg) {
    unsigned tag = (unsigned)(uintptr_t)arg;
    while (!stop) {
        size_t n = (tag & 1) ? 8 * MB + tag * 4096 : 1000;
        unsigned char *p = malloc(n);
        CHECK(p);
        fill(p, n, tag);
        CHECK(filled(p, n, tag));
        free(p);
        tag += 2;
    }
    return NULL;
}

int main(void) {
    /* fill the cache */
    void *warm[4];
    for (int i = 0; i < 4; i++) warm[i] = malloc(16 * MB);
    for (int i = 0; i < 4; i++) free(warm[i]);
    tm_stats_t s;
    if (tm_stats(&s) == 0 && s.enabled) CHECK(s.host_cached_blocks > 0);

    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, churn, (void *)i) == 0);
    for (int k = 0; k < 40; k++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            for (int j = 0; j < 4; j++) {
                unsigned char *p = malloc(16 * MB);
                fill(p, 16 * MB, j);
                CHECK(filled(p, 16 * MB, j));
                char *small = strdup("child");
                free(small);
                free(p);
            }
            _exit(0);
        }
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    puts("fork ok");
    return 0;
}
