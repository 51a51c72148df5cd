/* The library loaded by path after the program started, RTLD_GLOBAL (as the Python package loads
 * it without the preload), between two C++ plugins loaded RTLD_LOCAL (as Python loads
 * extensions): the later plugin's operator new[] of 64 MiB, deleted by the earlier plugin,
 * whose delete[] is libstdc++'s (Note [A copy the process does not allocate through]). With
 * CUDA plugins (c/late_copy_cuda_*.c, over the stand-in runtime): the later one's cudaMalloc of
 * 1 MiB, freed by the earlier one's cudaFree, which must answer 0.
 * Usage: late_copy EARLIER.so LIBRARY|none LATER.so. Prints "done". */
#include "check.h"
#include <dlfcn.h>

int main(int argc, char **argv) {
    CHECK(argc == 4);
    void *earlier = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(earlier);
    if (strcmp(argv[2], "none")) CHECK(dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL));
    void *later = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
    CHECK(later);
    void *(*cuda_alloc)(size_t) = (void *(*)(size_t))dlsym(later, "plugin_alloc");
    if (cuda_alloc) {
        int (*cuda_free)(void *) = (int (*)(void *))dlsym(earlier, "plugin_free");
        CHECK(cuda_free);
        for (int i = 0; i < 4; i++) {
            void *p = cuda_alloc(MB);
            CHECK(p);
            int rc = cuda_free(p);
            if (rc) printf("cudaFree: %d\n", rc);
        }
        printf("done\n");
        return 0;
    }
    char *(*made)(size_t) = (char *(*)(size_t))dlsym(later, "plugin_new");
    void (*deleted)(char *) = (void (*)(char *))dlsym(earlier, "plugin_delete");
    CHECK(made && deleted);
    for (int i = 0; i < 4; i++) {
        char *p = made(64 * MB);
        CHECK(p && p[0] == 3 && p[64 * MB - 1] == 3);
        deleted(p);
    }
    printf("done\n");
    return 0;
}
