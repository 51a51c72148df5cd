/* What a conservative collector (Boehm GC) scans of each loaded object at every collection: its
 * writable PT_LOAD segments, found with dl_iterate_phdr as the collector finds them. Prints the
 * bytes of every object whose name contains argv[1], after a large block was allocated and freed
 * (so tables mapped at first use have been). */
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *wanted;
static size_t total;
static int objects;

static int each(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, wanted)) return 0;
    objects++;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) total += ph->p_memsz;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    wanted = argv[1];
    char *big = malloc(64 << 20);
    if (!big) return 1;
    big[0] = 1;
    free(big);
    dl_iterate_phdr(each, NULL);
    printf("objects %d writable %zu\n", objects, total);
    return 0;
}
