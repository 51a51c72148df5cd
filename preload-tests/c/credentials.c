/* Drops privileges as setpriv and libcap-ng do, with our background thread running: keep
 * capabilities, setresuid to nobody, capset raising the effective set again (in this thread
 * only: capabilities are per thread), then setresgid, which glibc makes every thread of the
 * process make and aborts the process when one fails where another succeeds (a thread of ours
 * left with the old capabilities would). Then a large block is cached again. Prints one line:
 * "ok THREADS_BEFORE THREADS_AFTER" (from /proc/self/status). Runs as root. */
#include "check.h"
#include <linux/capability.h>
#include <sys/prctl.h>
#include <unistd.h>

/* glibc exports these without declaring them (libcap's header does). */
extern int capget(cap_user_header_t header, cap_user_data_t data);
extern int capset(cap_user_header_t header, const cap_user_data_t data);

int main(void) {
    CHECK(getuid() == 0);
    churn_large(1, 64 * MB, 1); /* a block enters the cache: the background thread starts */
    int before = thread_count();
    CHECK(prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) == 0);
    CHECK(setresuid(65534, 65534, 65534) == 0);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    CHECK(capget(&header, data) == 0);
    data[0].effective = data[0].permitted;
    data[1].effective = data[1].permitted;
    errno = 1234; /* a success leaves errno as it was (under glibc alone too) */
    CHECK(capset(&header, data) == 0);
    if (errno != 1234) printf("errno after capset: %d\n", errno);
    CHECK(errno == 1234);
    CHECK(setresgid(65534, 65534, 65534) == 0);
    churn_large(1, 64 * MB, 2);
    printf("ok %d %d\n", before, thread_count());
    return 0;
}
