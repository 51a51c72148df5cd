/* A C++ library that a C program dlopens with RTLD_LOCAL, as Python loads an extension: its
 * libstdc++ is then outside the scope dlsym(RTLD_NEXT) searches from a preloaded library, and
 * tensormalloc must still find the next operator new (the copy already loaded). */
#include <cstddef>
#include <cstring>
#include <new>

static volatile std::size_t impossible = std::size_t(1) << 50;

extern "C" int cxx_local_run(void) {
    for (int i = 0; i < 20; i++) {
        std::size_t n = std::size_t(32) << 20;
        char *p = new char[n];
        std::memset(p, i, n);
        if (p[n / 2] != char(i)) return 1;
        delete[] p;
        int *small = new int(i);
        if (*small != i) return 2;
        delete small;
    }
    try {
        void *p = ::operator new(impossible);
        (void)p;
        return 3;
    } catch (const std::bad_alloc &) {
    }
    return 0;
}
