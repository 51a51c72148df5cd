/* The libraries test_footprint.py builds from this file, by -D: FOOTPRINT_PLUGIN (a plugin
 * loaded and unloaded again and again, a large block each time, freed), FOOTPRINT_FINAL (loaded
 * last, keeps a block), FOOTPRINT_OTHER (another library's malloc, for the huge-page advice). */
#include <stdlib.h>
#include <string.h>

#if defined(FOOTPRINT_PLUGIN)
void plugin_run(void) {
    char *p = malloc(8 << 20);
    if (p) {
        memset(p, 1, 4096);
        free(p);
    }
}
#elif defined(FOOTPRINT_FINAL)
void *final_hold(void) {
    char *p = malloc(8 << 20);
    if (p) memset(p, 1, 4096);
    return p;
}
#else
void *other_malloc(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory"); /* a call, not a tail call: the block is this library's */
    return p;
}
#endif
