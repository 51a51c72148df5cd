/* Fork with other libraries' fork handlers that allocate: one registered before ours (the
 * linked fork_handlers_lib, from its constructor), one after (the program's own, in main), with
 * a thread churning large blocks meanwhile. Every fork must finish, and every child must find
 * plain memory in the blocks its handlers and its own code allocate. Each process gives itself
 * 30 s (alarm): a hang is a failure, not a stuck test.
 * Usage: fork_handlers FORKS */
#include "check.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

int fork_handlers_lib_loaded(void);

#define BLOCK (24u << 20)

static atomic_int stop;

static void touch_and_free(unsigned char *p, size_t n, unsigned char tag) {
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i += 4096) p[i] = tag;
    for (size_t i = 0; i < n; i += 4096) CHECK(p[i] == tag);
    free(p);
}

static void late_prepare(void) { touch_and_free(malloc(BLOCK), BLOCK, 4); }
static void late_parent(void) { touch_and_free(calloc(1, BLOCK), BLOCK, 5); }
static void late_child(void) { touch_and_free(malloc(BLOCK + 4096), BLOCK + 4096, 6); }

static void *churner(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) touch_and_free(malloc(BLOCK + 65536), BLOCK + 65536, 7);
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 50;
    CHECK(fork_handlers_lib_loaded());
    CHECK(pthread_atfork(late_prepare, late_parent, late_child) == 0);
    alarm(30);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, churner, NULL) == 0);
    unsigned char *held = malloc(BLOCK);
    touch_and_free(malloc(BLOCK), BLOCK, 8); /* something in the cache before the first fork */
    for (size_t i = 0; i < BLOCK; i += 4096) held[i] = 9;
    int bad = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            alarm(30);
            for (size_t j = 0; j < BLOCK; j += 4096)
                if (held[j] != 9) _exit(3); /* a block live at the fork is the child's too */
            touch_and_free(malloc(BLOCK), BLOCK, 10);
            free(held);
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
    }
    atomic_store(&stop, 1);
    CHECK(pthread_join(t, NULL) == 0);
    free(held);
    printf("forks %d bad children %d\n", forks, bad);
    CHECK(bad == 0);
    printf("fork handlers ok\n");
    return 0;
}
