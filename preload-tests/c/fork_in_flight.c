/* Forks while other threads take large blocks from the cache and give them back, so that some
 * forks land while a block is between the cache and the program (Note [Blocks in flight]). Each
 * child maps memory of its own with glibc's mmap-sized requests, which the kernel places in the
 * holes the uninherited cached blocks left, and frees it: a child that still recorded such a
 * block as ours would take its own pointer for the inside of ours and abort. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static volatile int stop;

static void *churn(void *arg) {
    size_t size = (size_t)(uintptr_t)arg;
    while (!stop) {
        char *p = malloc(size);
        CHECK(p);
        p[0] = 1;
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 300;
    pthread_t t[3];
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)((8 + 4 * i) << 20)) == 0);
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            void *mine[16];
            for (int k = 0; k < 16; k++) {
                mine[k] = malloc((size_t)(256 + 64 * k) << 10); /* glibc: an mmap each */
                CHECK(mine[k]);
                memset(mine[k], k, 4096);
            }
            for (int k = 0; k < 16; k++) free(mine[k]);
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("child %d of %d failed\n", i, forks);
            return 1;
        }
    }
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    printf("%d forks ok\n", forks);
    return 0;
}
