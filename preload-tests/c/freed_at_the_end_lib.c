/* A library linked into the program (c/freed_at_the_end.c) that holds large blocks until the
 * process ends: one freed by its finalizer (as a C++ library's global objects are by their
 * destructors), one by an exit handler its constructor registered. Neither is a leak. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *held_to_finalizer, *held_to_handler;

static void handler_frees(void) {
    free(held_to_handler);
    fprintf(stderr, "library exit handler freed its block\n");
}

__attribute__((constructor)) static void takes(void) {
    held_to_finalizer = malloc(64 << 20);
    held_to_handler = malloc(24 << 20);
    if (!held_to_finalizer || !held_to_handler) abort();
    memset(held_to_finalizer, 1, 64 << 20);
    memset(held_to_handler, 2, 24 << 20);
    atexit(handler_frees);
}

__attribute__((destructor)) static void finalizer_frees(void) {
    free(held_to_finalizer);
    fprintf(stderr, "library finalizer freed its block\n");
}

int held_byte(void) { return held_to_finalizer[5] + held_to_handler[5]; }
