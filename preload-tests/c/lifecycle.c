/* Calls before main (a constructor), from atexit handlers and from a destructor, and a double
 * free of a large block, which must abort with glibc's message rather than corrupt the cache. */
#include "check.h"

__attribute__((constructor)) static void before_main(void) {
    void *p = malloc(32 * MB);
    CHECK(p);
    memset(p, 1, 32 * MB);
    free(p);
    free(malloc(100));
}

static void at_exit_handler(void) {
    unsigned char *p = calloc(1, 32 * MB);
    CHECK(p && p[12345] == 0);
    free(p);
}

__attribute__((destructor)) static void after_main(void) {
    void *p = malloc(48 * MB);
    CHECK(p);
    memset(p, 2, 48 * MB);
    free(p);
    puts("destructor ok");
}

int main(int argc, char **argv) {
    atexit(at_exit_handler);
    if (argc > 1 && strcmp(argv[1], "double-free") == 0) {
        void *p = malloc(32 * MB);
        free(p);
        free(p);
        puts("not reached");
        return 0;
    }
    puts("main ok");
    return 0;
}
