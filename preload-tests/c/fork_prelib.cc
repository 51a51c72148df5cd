// A library linked into the program (fork_claim.c): its constructor, run before a preloaded
// library's, registers a child fork handler that allocates a large block (as random number
// generators and tracers do), so it runs before ours in the child.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void child() {
    void *p = malloc(32u << 20);
    if (p) {
        memset(p, 1, 4096);
        free(p);
    }
}

__attribute__((constructor)) static void init() { pthread_atfork(nullptr, nullptr, child); }

extern "C" int fork_prelib_loaded() { return 1; }
