/* Looks up names by dlsym (which a preloaded hook should see) and churns large blocks; run with
 * another dlsym hook preloaded before or after tensormalloc, it must finish, and the hook must
 * see every lookup. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

int main(void) {
    for (int i = 0; i < 3; i++) {
        void *p = dlsym(RTLD_DEFAULT, "probe_missing");
        CHECK(p == NULL);
    }
    CHECK(dlsym(RTLD_DEFAULT, "strlen") != NULL);
    for (int i = 0; i < 20; i++) {
        char *b = malloc((size_t)(8 + i) << 20);
        CHECK(b != NULL);
        memset(b, i, (size_t)(8 + i) << 20);
        free(b);
    }
    printf("dlsym user ok\n");
    return 0;
}
