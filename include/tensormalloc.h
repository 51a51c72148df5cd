/* tensormalloc: a drop-in layer that caches large host blocks (and CUDA device memory).
 *
 * Load it with LD_PRELOAD=libtensormalloc.so, or link it (-ltensormalloc) ahead of libc.
 * This header is optional: it reads statistics and controls the cache at run time. Every
 * function is safe to call from any thread, at any time, including before main and at exit.
 */
#ifndef TENSORMALLOC_H
#define TENSORMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TM_STATS_VERSION 2

/* A snapshot of the counters. It can grow: set `size` to sizeof(tm_stats_t) before calling
 * tm_get_stats, which fills at most that many bytes and sets `size` to what it filled, and
 * check `version` before reading fields added after version 1. */
typedef struct tm_stats_t {
    size_t size;
    uint32_t version;
    uint32_t enabled;               /* 1 when large blocks are being cached */
    uint64_t threshold_bytes;       /* requests from this size up go to the cache */
    uint64_t host_requests;         /* large allocations */
    uint64_t host_hits;             /* served from a cached block */
    uint64_t host_misses;           /* served by a fresh mapping */
    uint64_t host_grows;            /* misses served with the pages of cached blocks (mremap) */
    uint64_t host_hit_bytes;
    uint64_t host_frees;
    uint64_t host_live_bytes;       /* large blocks handed out and not yet freed */
    uint64_t host_peak_live_bytes;
    uint64_t host_cached_bytes;     /* freed large blocks kept for reuse */
    uint64_t host_peak_cached_bytes;
    uint64_t host_cached_blocks;
    uint64_t host_released_blocks;  /* idle blocks released with MADV_FREE */
    uint64_t host_released_bytes;
    uint64_t host_unmapped_blocks;  /* blocks given back with munmap (expired, evicted, trimmed) */
    uint64_t host_unmapped_bytes;
    uint64_t host_map_failures;     /* mmap refused even after emptying the cache */
    /* CUDA device pools, summed over devices (zero in a process that never called CUDA) */
    uint64_t cuda_requests;         /* cudaMalloc and tm_cuda_alloc calls served by the pool */
    uint64_t cuda_hits;             /* served without a new cudaMalloc */
    uint64_t cuda_segments_mapped;  /* real cudaMalloc calls made by the pool */
    uint64_t cuda_segments_released;/* real cudaFree calls made by the pool */
    uint64_t cuda_oom_retries;      /* out of memory, cache given back, retried */
    uint64_t cuda_oom_failures;     /* out of memory even after that (or over the cap) */
    uint64_t cuda_reserved_bytes;   /* held from the runtime */
    uint64_t cuda_peak_reserved_bytes;
    uint64_t cuda_live_bytes;       /* handed out to the program */
    uint64_t cuda_peak_live_bytes;
    uint64_t pinned_requests;       /* cudaMallocHost / cudaHostAlloc */
    uint64_t pinned_hits;
    uint64_t pinned_cached_bytes;
    uint64_t pinned_peak_cached_bytes;
    /* Version 2: the cached bytes by what they cost in RSS. Resident: freed recently, pages in
     * memory. Lazily freed: released with MADV_FREE, still counted in RSS and the cgroup's usage
     * (LazyFree in smaps) until the kernel needs the pages. The rest were dropped. */
    uint64_t host_cached_resident_bytes;
    uint64_t host_cached_lazyfree_bytes;
} tm_stats_t;

/* The library version, e.g. "0.1.0". */
const char *tm_version(void);

/* Fills *out (see tm_stats_t). Returns 0, or -1 if out is NULL or out->size < 16. */
int tm_get_stats(tm_stats_t *out);

/* Gives every cached block back to the system now. Returns the bytes released. */
size_t tm_trim(void);

/* Gives device `device`'s cached blocks back to the CUDA driver now (-1: every device's, and the
 * pinned cache), for other processes; returns the bytes released. */
size_t tm_cuda_trim(int device);

/* Turns caching of large blocks on (1) or off (0); returns the previous setting. Turning it
 * off empties the cache; blocks already handed out are still freed correctly. */
int tm_set_enabled(int on);
int tm_is_enabled(void);

/* Writes the report now: to stderr, or (TENSORMALLOC_STATS=json:PATH) into this process's stats
 * file, which `tensormalloc report PATH` reads while it runs; the file becomes JSON at exit. */
void tm_print_stats(void);

/* Writes a memory snapshot in the format of PyTorch's (torch.cuda.memory._dump_snapshot), for
 * `python -m torch.cuda._memory_viz stats|segments|trace_plot PATH` and pytorch.org/memory_viz:
 * the device pools' segments and blocks, who holds each block (the calling library and
 * function), and the recent allocations and frees. Host memory (large blocks, pinned blocks)
 * goes to PATH.host.pickle in the same format. Returns 0, or a negative errno (-ENOENT: the
 * directory does not exist, -EACCES, ...). TENSORMALLOC_SNAPSHOT_AT_EXIT=PATH writes one at exit. */
int tm_snapshot(const char *path);

/* Scoped accounting, per thread: every large host block (at or above the threshold) and every
 * device block this thread allocates or frees inside the scope counts in it and in every scope
 * around it. Scopes nest up to 16 deep. */
typedef struct tm_scope_t {
    char name[48];
    uint32_t depth;                 /* 1 for the outermost scope */
    uint32_t reserved;
    uint64_t allocations;
    uint64_t frees;
    uint64_t allocated_bytes;
    uint64_t freed_bytes;
    uint64_t peak_bytes;            /* highest allocated - freed while open */
    int64_t live_bytes;             /* allocated - freed: still live (leaked) at the end */
} tm_scope_t;

int tm_scope_begin(const char *name);      /* returns the depth, or -1 when 16 are open */
int tm_scope_end(tm_scope_t *out);         /* closes the innermost; 0, or -1 if none open */
int tm_scope_current(tm_scope_t *out);     /* reads the innermost without closing it */

/* Who holds the memory: one row per holder (the shared object whose code asked for the block,
 * or a hook's library: "numpy", "torch", "cupy", "numba") and place, for every large host block,
 * device block and pinned block, then what tensormalloc keeps cached in each place (cached = 1).
 * Live plus unused bytes add up to host_live_bytes and cuda_live_bytes of tm_stats_t. */
typedef struct tm_holder_t {
    char name[64];                  /* the object's file name, NUL-terminated */
    int32_t place;                  /* -1 host, -2 pinned host memory, N >= 0 CUDA device N */
    int32_t cached;                 /* 1: tensormalloc's own cache in that place */
    uint64_t live_bytes;            /* asked for by the live blocks (cached rows: cached now) */
    uint64_t peak_bytes;            /* the most this holder held there at once */
    uint64_t blocks;                /* live blocks */
    uint64_t unused_bytes;          /* handed out beside what was asked (page rounding, a cached
                                       block a little larger than the request) */
} tm_holder_t;

/* Writes up to `capacity` rows, biggest first, every holder its own row, and returns how many
 * rows there are (call again with more room when that is more than `capacity`). `out` may be
 * NULL when capacity is 0. Live plus unused bytes of the holders' rows add up to
 * host_live_bytes and cuda_live_bytes of tm_stats_t. The table names up to 511 holders; more
 * are counted in the "unknown" row (the exit report says how many).
 * A block is charged to the shared object whose code called the malloc family (or operator
 * new, or a hook that names its library), by a call or by a tail call: a wrapper such as
 * xmalloc() is its library's whether it calls malloc and returns or jumps to it (`return
 * malloc(n);` at -O2). Only a wrapper reached through a function pointer that ends in a tail
 * call is invisible (its caller is then charged). */
size_t tm_holders(tm_holder_t *out, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif /* TENSORMALLOC_H */
