/* The driver's virtual memory API as the scenario programs call it (NVIDIA's signatures and
 * structure layouts, cuda.h), declared once for c/cuda_correct.c, c/cuda_misuse.c and
 * c/vmm_rules.c: they run over the stand-in driver (c/fakecuda.c, a simulator). */
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
typedef struct { int type; int requestedHandleTypes; struct { int type; int id; } location; void *win32HandleMetaData; unsigned char allocFlags[8]; } CUmemAllocationProp;
typedef struct { struct { int type; int id; } location; int flags; } CUmemAccessDesc;

int cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
int cuMemCreate(unsigned long long *, size_t, const CUmemAllocationProp *, unsigned long long);
int cuMemRelease(unsigned long long);
int cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
int cuMemAddressFree(CUdeviceptr, size_t);
int cuMemMap(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
int cuMemUnmap(CUdeviceptr, size_t);
int cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
