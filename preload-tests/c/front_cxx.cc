// C++ and aligned allocations under a tracer that adds a header (c/header_tracer.c, or glibc's
// memusage): operator new and delete in every common form, small and large, and the aligned C
// calls the tracer lacks, each block written and freed. Prints "front cxx ok".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <new>
#include <string>
#include <vector>

struct alignas(64) Wide { char bytes[64]; };

int main() {
    for (int round = 0; round < 8; round++) {
        int *small = new int[10];
        small[0] = round;
        delete[] small;
        char *large = new char[8 << 20];
        std::memset(large, round, 8 << 20);
        delete[] large;
        std::string *s = new std::string(300000, 'x');
        delete s;
        Wide *w = new Wide[5000];
        w[4999].bytes[0] = 1;
        delete[] w;
        std::vector<std::string> v;
        for (int i = 0; i < 100; i++) v.push_back(std::string(100, 'y'));
        void *a = nullptr;
        if (posix_memalign(&a, 64, 300000) != 0) return 1;
        std::memset(a, 1, 300000);
        free(a);
        void *b = aligned_alloc(4096, 8 << 20);
        void *c = memalign(256, 500000);
        if (!b || !c) return 1;
        std::memset(b, 2, 8 << 20);
        std::memset(c, 3, 500000);
        free(b);
        free(c);
    }
    std::puts("front cxx ok");
    return 0;
}
