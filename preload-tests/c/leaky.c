/* Leaks two 80 MB blocks and one 16 MB block on purpose; frees everything else. */
#include "check.h"

int main(void) {
    void *keep[3];
    keep[0] = malloc(80 * MB);
    keep[1] = malloc(80 * MB);
    keep[2] = calloc(1, 16 * MB);
    for (int i = 0; i < 3; i++) memset(keep[i], 1, 4096);
    for (int i = 0; i < 5; i++) free(malloc(32 * MB)); /* freed: not a leak */
    printf("leaked %p %p %p\n", keep[0], keep[1], keep[2]);
    return 0;
}
