/* The stand-in driver's virtual memory API (c/fakecuda.c, a simulator) against the rules NVIDIA's
 * driver API documents for it, run without tensormalloc: what the expandable segments of issue 28
 * will be tested over must answer as the driver does. Scenarios (argv[1]):
 *   rules     granularity, aligned sizes/offsets/addresses, mapping inside a reservation and only
 *             once, no access until cuMemSetAccess, whole-mapping unmap, the address range of a
 *             mapping, a released handle's memory kept until its last mapping goes
 *   no-vmm    FAKECUDA_NO_VMM=1: the attribute says 0 and every call answers NOT_SUPPORTED */
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include "check.h"
#include "standin.h"
#include "cuda_vmm.h"

typedef unsigned long long CUdeviceptr;

int cudaSetDevice(int);
int cuInit(unsigned);
int cuDeviceGetAttribute(int *, int, int);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);


#define G (2 * MB)
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_SUPPORTED = 801 };

static sigjmp_buf fault;
static void on_fault(int sig) { (void)sig; siglongjmp(fault, 1); }

/* Whether a host read of p faults (no access, as a device would fault). */
static int faults(CUdeviceptr p) {
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, &old);
    volatile int faulted = 0;
    if (sigsetjmp(fault, 1)) faulted = 1;
    else (void)*(volatile char *)(uintptr_t)p;
    sigaction(SIGSEGV, &old, NULL);
    return faulted;
}

static size_t used(void) {
    size_t free_b = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free_b, &total) == 0);
    return total - free_b;
}

static void rules(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    int supported = -1;
    CHECK(cuDeviceGetAttribute(&supported, 102, 0) == OK && supported == 1);
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, 0) == OK && gran == G);
    unsigned long long h = 0, h2 = 0;
    CHECK(cuMemCreate(&h, G + 4096, &prop, 0) == INVALID_VALUE); /* not a multiple */
    CUmemAllocationProp bad = prop;
    bad.location.id = 99;
    CHECK(cuMemCreate(&h, G, &bad, 0) == INVALID_VALUE);
    size_t before = used();
    CHECK(cuMemCreate(&h, 2 * G, &prop, 0) == OK && used() == before + 2 * G);
    CHECK(cuMemCreate(&h2, 1UL << 40, &prop, 0) == OUT_OF_MEMORY);
    CHECK(cuMemCreate(&h2, G, &prop, 0) == OK);

    CUdeviceptr va = 0, base = 0;
    size_t got = 0;
    CHECK(cuMemAddressReserve(&va, 3 * G + 4096, 0, 0, 0) == INVALID_VALUE);
    CHECK(cuMemAddressReserve(&va, 8 * G, 0, 0, 0) == OK && va % G == 0);
    CHECK(used() == before + 3 * G); /* address space costs no memory */
    CHECK(cuMemMap(va + 4096, G, 0, h, 0) == INVALID_VALUE);   /* address not aligned */
    CHECK(cuMemMap(va, G, 4096, h, 0) == INVALID_VALUE);       /* offset not aligned */
    CHECK(cuMemMap(va, 3 * G, 0, h, 0) == INVALID_VALUE);      /* more than the handle */
    CHECK(cuMemMap(va + 7 * G, 2 * G, 0, h, 0) == INVALID_VALUE); /* past the reservation */
    CHECK(cuMemMap(va - 4 * G, G, 0, h, 0) == INVALID_VALUE);  /* outside any reservation */
    CHECK(cuMemMap(va, 2 * G, 0, h, 0) == OK);
    CHECK(cuMemMap(va + G, G, 0, h2, 0) == INVALID_VALUE);     /* mapped already */
    CHECK(cuMemMap(va + 2 * G, G, 0, h2, 0) == OK);
    CHECK(faults(va) && faults(va + 2 * G));                    /* no access yet */
    CUmemAccessDesc rw = {{1, 0}, 3};
    CHECK(cuMemSetAccess(va, 4 * G, &rw, 1) == INVALID_VALUE);  /* the last granule is not mapped */
    CHECK(cuMemSetAccess(va, 3 * G, &rw, 1) == OK);
    CHECK(!faults(va) && !faults(va + 3 * G - 1) && faults(va + 3 * G));
    kernel_works((void *)(uintptr_t)va, 2 * G, 0x5a); /* a kernel works within one mapping */
    kernel_works((void *)(uintptr_t)(va + 2 * G), G, 0x5b);
    /* The address range of a mapped address is its mapping's. */
    CHECK(cuMemGetAddressRange_v2(&base, &got, va + G + 100) == OK && base == va && got == 2 * G);
    CHECK(cuMemGetAddressRange_v2(&base, &got, va + 2 * G) == OK && base == va + 2 * G && got == G);
    CHECK(cuMemGetAddressRange_v2(&base, &got, va + 5 * G) != OK);
    /* Unmap: whole mappings only (one or several side by side). */
    CHECK(cuMemUnmap(va, G) == INVALID_VALUE);
    CHECK(cuMemUnmap(va + G, 2 * G) == INVALID_VALUE);
    /* A released handle keeps its memory while mapped, and is dead to the program at once. */
    CHECK(cuMemRelease(h) == OK && used() == before + 3 * G);
    CHECK(cuMemRelease(h) == INVALID_VALUE);
    CHECK(cuMemMap(va + 4 * G, G, 0, h, 0) == INVALID_VALUE);
    CHECK(holds((void *)(uintptr_t)va, 2 * G, 0x5a));
    CHECK(cuMemUnmap(va, 3 * G) == OK); /* both mappings */
    CHECK(used() == before + G && faults(va) && faults(va + 2 * G));
    CHECK(cuMemGetAddressRange_v2(&base, &got, va) != OK);
    /* The physical memory mapped somewhere else holds what it held. */
    CHECK(cuMemMap(va + 6 * G, G, 0, h2, 0) == OK && cuMemSetAccess(va + 6 * G, G, &rw, 1) == OK);
    CHECK(holds((void *)(uintptr_t)(va + 6 * G), G, 0x5b));
    CHECK(cuMemRelease(h2) == OK && used() == before + G);
    CHECK(cuMemAddressFree(va, 8 * G) == OK && used() == before); /* its last mapping went with the range */
}

static void without_vmm(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    int supported = -1;
    size_t gran = 0;
    unsigned long long h = 0;
    CUdeviceptr va = 0;
    CHECK(cuDeviceGetAttribute(&supported, 102, 0) == OK && supported == 0);
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, 0) == NOT_SUPPORTED);
    CHECK(cuMemCreate(&h, G, &prop, 0) == NOT_SUPPORTED);
    CHECK(cuMemAddressReserve(&va, G, 0, 0, 0) == NOT_SUPPORTED);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    CHECK(cudaSetDevice(0) == 0 && cuInit(0) == 0);
    if (!strcmp(argv[1], "rules")) rules();
    else if (!strcmp(argv[1], "no-vmm")) without_vmm();
    else CHECK(!"unknown scenario");
    printf("%s ok\n", argv[1]);
    return 0;
}
