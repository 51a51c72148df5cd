/* mlockall(MCL_CURRENT) first thing in main: under an unprivileged process's default 8 MiB
 * RLIMIT_MEMLOCK, the kernel refuses it (ENOMEM) when the process's mappings add up to more.
 * Prints "mlockall ok" or "mlockall failed ERRNO". */
#include "check.h"
#include <sys/mman.h>

int main(void) {
    if (mlockall(MCL_CURRENT) == 0) printf("mlockall ok\n");
    else printf("mlockall failed %d\n", errno);
    return 0;
}
