/* One holder: copied under many names by test_holders.py, each copy its own shared object. */
#include <stdlib.h>

void *holder_alloc(size_t n) {
    void *p = malloc(n);
    return p; /* built with -fno-optimize-sibling-calls: a call, not a jump */
}
