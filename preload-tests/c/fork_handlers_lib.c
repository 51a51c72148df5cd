/* A library linked into the program whose constructor registers fork handlers that allocate
 * and free large blocks (as threading runtimes, RNGs and tracers do). Its constructor runs
 * before a preloaded library's, so its prepare handler runs after that library's, and its
 * parent and child handlers before that library's. Which handlers allocate: FORK_HANDLERS_LIB
 * = prepare, parent, child or all (default all). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (32u << 20)

static int which(const char *name) {
    const char *w = getenv("FORK_HANDLERS_LIB");
    return !w || !strcmp(w, "all") || !strcmp(w, name);
}

/* Allocates, writes every page and frees: a block that is not plain memory crashes here. */
static void churn(unsigned char tag) {
    unsigned char *p = malloc(BLOCK);
    if (!p) abort();
    for (size_t i = 0; i < BLOCK; i += 4096) p[i] = tag;
    for (size_t i = 0; i < BLOCK; i += 4096)
        if (p[i] != tag) abort();
    free(p);
}

static void prepare(void) { if (which("prepare")) churn(1); }
static void parent(void) { if (which("parent")) churn(2); }
static void child(void) { if (which("child")) churn(3); }

__attribute__((constructor)) static void registers_early(void) {
    pthread_atfork(prepare, parent, child);
}

/* Referenced by the program, so the linker keeps this library as a dependency. */
int fork_handlers_lib_loaded(void) { return 1; }
