/* A second preloaded library that hooks dlsym, as MangoHud, VirtualGL and tracing tools do: it
 * counts the lookups it sees and forwards them to glibc's dlsym, found with dlvsym. Built as a
 * shared object; at exit it prints how many lookups of names starting with "probe" it saw. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int probes;

static void *(*real_dlsym(void))(void *, const char *) {
    static void *(*real)(void *, const char *);
    if (!real) real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real) real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return real;
}

void *dlsym(void *handle, const char *name) {
    if (name && strncmp(name, "probe", 5) == 0) probes++;
    /* RTLD_NEXT from the program would be relative to this library here; the test does not use it. */
    return real_dlsym()(handle, name);
}

__attribute__((destructor)) static void report(void) {
    char line[64];
    int n = snprintf(line, sizeof line, "hook saw %d probe lookups\n", probes);
    if (write(2, line, (size_t)n) < 0) {}
}
