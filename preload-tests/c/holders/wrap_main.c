/* test_holders.py's wrapper program: asks libwrap_tail.so (built -O2: tail calls),
 * libwrap_call.so (built -O0: calls) and libwrap_new.so (C++, -O2) for 8 MiB each through
 * their wrappers, then prints the holders ("ROW name place cached live"). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensormalloc.h"

void *tail_xmalloc(size_t);
void *call_xmalloc(size_t);
void *tail_xmalloc_checked(size_t);
char *make(size_t);

#define MIB (1ul << 20)

int main(void) {
    void *a = tail_xmalloc(8 * MIB), *b = call_xmalloc(8 * MIB), *c = tail_xmalloc_checked(8 * MIB);
    char *d = make(8 * MIB);
    if (!a || !b || !c || !d) return 3;
    memset(a, 1, 8 * MIB);
    size_t (*get_holders)(tm_holder_t *, size_t, size_t) = (size_t (*)(tm_holder_t *, size_t, size_t))dlsym(RTLD_DEFAULT, "tm_get_holders");
    if (!get_holders) return 5;
    tm_holder_t rows[64];
    size_t n = get_holders(rows, 64, sizeof(tm_holder_t));
    for (size_t i = 0; i < n && i < 64; i++)
        printf("ROW %s %d %d %llu\n", rows[i].name, rows[i].place, rows[i].cached, (unsigned long long)rows[i].live_bytes);
    return 0;
}
