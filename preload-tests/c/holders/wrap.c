/* A library's allocation wrappers, compiled twice by test_holders.py: at -O2 `xmalloc` is a tail
 * call (`jmp malloc@plt`) and `make` a tail call to operator new[]; `xmalloc_checked` always
 * calls. Whatever the compilation, the blocks are this library's (Note [Wrappers and tail
 * calls]). */
#include <stdlib.h>

void *xmalloc(size_t n) {
    return malloc(n);
}

void *xmalloc_checked(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    return p;
}
