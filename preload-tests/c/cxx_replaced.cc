// A program that replaces operator new(size_t) and operator delete(void*) only, as leak counters
// and pool allocators do; here each block carries a 16-byte header before what new returns. The
// standard makes every other form call these two (Note [Operators the program replaced] in
// src/sys/next_cxx.rs). Every form is exercised, small and large (32 MiB, which the program's new
// gets from malloc, so from us); prints "news=N deletes=N headers ok" with the counts, the same
// with or without the preload.
// Built with -DOPERATORS_ONLY as a shared library (the operators, and two calls that use them
// from inside it) and with -DMAIN_ONLY as a program linked with it: the same operators in a
// library behind us (linked, preloaded after us, or bound inside itself by -Bsymbolic-functions),
// and blocks crossing between the library's calls and the program's (13 news, 13 deletes).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#ifdef MAIN_ONLY
extern size_t news, deletes;
void *replaced_make(size_t n);
void replaced_take(void *p);
#else
size_t news = 0, deletes = 0;
static const size_t MARK = 0xfeedface;

void *operator new(std::size_t n) {
    char *p = static_cast<char *>(std::malloc(n + 16));
    if (!p) throw std::bad_alloc();
    *reinterpret_cast<size_t *>(p) = MARK;
    news++;
    return p + 16;
}

void operator delete(void *p) noexcept {
    if (!p) return;
    char *q = static_cast<char *>(p) - 16;
    if (*reinterpret_cast<size_t *>(q) != MARK) {
        std::fprintf(stderr, "operator delete: not a block of this program's new\n");
        std::abort();
    }
    deletes++;
    std::free(q);
}

void *replaced_make(size_t n) { return operator new(n); }
void replaced_take(void *p) { operator delete(p); }
#endif

#ifndef OPERATORS_ONLY

struct S {
    long a[4];
};

int main() {
    const size_t big = 32u << 20;
    S *s = new S;  // sized delete (_ZdlPvm) below
    delete s;
    for (size_t n : {size_t(100), big}) {
        int *a = new int[n / sizeof(int)];  // _Znam, then _ZdaPv
        std::memset(a, 1, n);
        delete[] a;
        char *c = new (std::nothrow) char[n];  // _ZnamRKSt9nothrow_t
        if (!c) return 1;
        std::memset(c, 2, n);
        operator delete[](c, std::nothrow);  // _ZdaPvRKSt9nothrow_t
        void *v = operator new(n, std::nothrow);  // _ZnwmRKSt9nothrow_t
        operator delete(v, n);  // _ZdlPvm
        std::vector<char> vec(n, 'x');
        std::string str(n, 'y');
    }
#ifdef MAIN_ONLY
    void *made = replaced_make(big);  // the library's new, the program's delete
    std::memset(made, 3, big);
    operator delete(made);
    void *taken = operator new(big);  // the program's new, the library's delete
    std::memset(taken, 4, big);
    replaced_take(taken);
#endif
    std::printf("news=%zu deletes=%zu headers ok\n", news, deletes);
    return 0;
}
#endif
