/* SIMULATOR: a stand-in NVML (libnvidia-ml.so.1) beside the stand-in CUDA driver; not NVIDIA's library. */
/* PyTorch dlopens libnvidia-ml.so.1 and, when it is there, asserts that six entry points exist
 * (c10/cuda/driver_api.cpp); its expandable segments ask NVML for the device by PCI bus id and
 * for its fabric state before the first mapping, and call a null pointer when the library is
 * missing. This one answers for the stand-in driver's devices (FAKECUDA_DEVICES, PCI bus 0x10
 * + ordinal, as fakecuda_runtime.c says): no fabric, no NVLink, no processes listed, driver
 * version 13020. No state beyond the device table; no malloc. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6 };
#define MAX_DEV 4

struct fake_nvml_device { int index; };
typedef struct fake_nvml_device *nvmlDevice_t;
static struct fake_nvml_device devices[MAX_DEV] = {{0}, {1}, {2}, {3}};

static unsigned count(void) {
    const char *v = getenv("FAKECUDA_DEVICES");
    int n = v ? atoi(v) : 2;
    return n < 1 ? 1 : n > MAX_DEV ? MAX_DEV : (unsigned)n;
}

static int known(nvmlDevice_t d) { return d >= devices && d < devices + count(); }

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 13020;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (!d || i >= count()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devices[i];
    return NVML_SUCCESS;
}

/* "domain:bus:device.function", hexadecimal, as cudaDeviceProp's PCI fields print. */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *d) {
    unsigned domain, bus, device;
    if (!id || !d || sscanf(id, "%x:%x:%x", &domain, &bus, &device) != 3) return NVML_ERROR_INVALID_ARGUMENT;
    if (domain != 0 || device != 0 || bus < 0x10 || bus - 0x10 >= count()) return NVML_ERROR_NOT_FOUND;
    *d = &devices[bus - 0x10];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) {
    if (!known(d) || !i) return NVML_ERROR_INVALID_ARGUMENT;
    *i = (unsigned)d->index;
    return NVML_SUCCESS;
}

/* The same UUID the stand-in driver gives the device, in NVML's text form. */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned len) {
    if (!known(d) || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    const unsigned char *b = (const unsigned char *)"fakecuda-gpu-\0\0\0";
    char text[64];
    int n = snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                     b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], d->index);
    if ((unsigned)n >= len) return NVML_ERROR_INVALID_ARGUMENT;
    memcpy(uuid, text, (size_t)n + 1);
    return NVML_SUCCESS;
}

/* No process is listed (the stand-in's devices are memory in each process). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned *n, void *infos) {
    (void)infos;
    if (!known(d) || !n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *n, void *infos) {
    return nvmlDeviceGetComputeRunningProcesses(d, n, infos);
}

/* No NVLink. */
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned link, int *type) {
    (void)link, (void)type;
    return known(d) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned link, void *pci) {
    (void)link, (void)pci;
    return known(d) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

/* nvmlGpuFabricInfo_v2_t; version 3 adds fields after these. No fabric: state NOT_SUPPORTED. */
struct fabric_info {
    unsigned version;
    unsigned char cluster_uuid[16];
    nvmlReturn_t status;
    unsigned clique_id;
    unsigned char state;
    unsigned health_mask;
};

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, struct fabric_info *info) {
    if (!known(d) || !info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = info->version >> 24;
    if (version < 2 || version > 3) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info->cluster_uuid, 0, sizeof info->cluster_uuid);
    info->status = NVML_SUCCESS;
    info->clique_id = 0;
    info->state = 0; /* NVML_GPU_FABRIC_STATE_NOT_SUPPORTED */
    info->health_mask = 0;
    return NVML_SUCCESS;
}
