/* Loads cxx_local.so (argv[1]) with RTLD_LOCAL, as Python loads an extension, and runs it. */
#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc == 2);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) fprintf(stderr, "%s\n", dlerror());
    CHECK(h != NULL);
    int (*run)(void) = (int (*)(void))dlsym(h, "cxx_local_run");
    CHECK(run != NULL);
    int rc = run();
    if (rc) fprintf(stderr, "cxx_local_run: %d\n", rc);
    CHECK(rc == 0);
    puts("cxx local ok");
    return 0;
}
