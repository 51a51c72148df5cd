/* A C program (no C++ runtime of its own) that loads FIRST (C++ on a static libstdc++), calls
 * it, then SECOND (C++ on the shared libstdc++), whose impossible new must throw for it:
 * cxx_runtime_late_main FIRST.so SECOND.so (c/cxx_runtime_late.cc). */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *first = dlopen(argv[1], RTLD_NOW);
    if (!first) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    printf("static runtime: %d\n", ((int (*)(void))dlsym(first, "plugin_work"))());
    fflush(stdout);
    void *second = dlopen(argv[2], RTLD_NOW);
    if (!second) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    ((int (*)(void))dlsym(second, "plugin_work"))();
    fflush(stdout);
    return 0;
}
