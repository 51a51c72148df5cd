/* A program linked with c/freed_at_the_end_lib.c, whose blocks are freed only as the process
 * ends, after main (Note [Reports after every finalizer] in src/shim/lifecycle.rs). */
#include <stdio.h>
int held_byte(void);
int main(void) {
    printf("held byte %d\n", held_byte());
    return 0;
}
