/* tensormalloc: a drop-in layer that caches large host blocks (and CUDA device memory).
 *
 * Load it with LD_PRELOAD=libtensormalloc.so, or link it (-ltensormalloc) ahead of libc.
 * This header is optional: it reads statistics and controls the cache at run time. Every
 * function is safe to call from any thread, at any time, including before main and at exit,
 * and none changes errno. From a signal handler that interrupted tensormalloc's own work on
 * the same thread (a malloc or free of a large block), the calls that need its locks answer at
 * once as if there were nothing to give (tm_get_stats -1, tm_get_holders 0 rows, the trims 0
 * bytes, tm_print_stats one line on stderr, tm_snapshot -EDEADLK) rather than wait for that
 * work, which waits for the handler.
 */
#ifndef TENSORMALLOC_H
#define TENSORMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TM_STATS_VERSION 3

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
    /* Version 3: the rest of the report's host figures (docs/observability.md says each). */
    uint64_t host_handed_out_bytes;       /* every large block ever handed out, in bytes */
    uint64_t host_deferred_unmap_bytes;   /* evicted, waiting for our thread to unmap them */
    uint64_t host_bound_blocks;           /* the most the cache may keep now (follows the live peak) */
    uint64_t host_bound_bytes;
    uint64_t host_calloc_zeroed_by_discard; /* calloc hits zeroed with MADV_DONTNEED, not written */
    uint64_t host_reset_blocks;           /* freed blocks made plain again (protection, locks, advice) */
    uint64_t host_unresettable_blocks;    /* freed blocks that could not be: never reused */
    uint64_t host_retries_after_trim;     /* failed requests retried after the cache was emptied */
} tm_stats_t;

/* The library version, e.g. "0.1.0". */
const char *tm_version(void);

/* Fills *out (see tm_stats_t). Returns 0, or -1 if out is NULL or out->size < 16 (or from a
 * signal handler inside tensormalloc's work: see the top). */
int tm_get_stats(tm_stats_t *out);

/* Gives every cached block back to the system now. Returns the bytes released. */
size_t tm_trim(void);

/* Gives device `device`'s cached blocks back to the CUDA driver now (-1: every device's, and the
 * pinned cache), for other processes; returns the bytes released. */
size_t tm_cuda_trim(int device);

/* Turns caching of large blocks on (1) or off (0); returns the previous setting. Turning it
 * off empties the cache; blocks already handed out are still freed correctly, and go back to
 * the system when freed while it is off. Under TENSORMALLOC_DISABLE=1 (or where tensormalloc
 * stepped aside for glibc's malloc debugging) it stays off. */
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
 * directory does not exist, -EACCES, -EINVAL: PATH is not a regular file, ...).
 * TENSORMALLOC_SNAPSHOT_AT_EXIT=PATH writes one at exit. */
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

int tm_scope_begin(const char *name);      /* returns the depth, or -1 when 16 are open in this thread (or no page can be mapped for its first) */
int tm_scope_end(tm_scope_t *out);         /* closes the innermost; 0, or -1 if none open */
int tm_scope_current(tm_scope_t *out);     /* reads the innermost without closing it */

/* Who holds the memory: one row per holder (the shared object whose code asked for the block,
 * or a hook's library: "numpy", "torch", "cupy", "numba") and place, for every large host block,
 * device block and pinned block, then what tensormalloc keeps cached in each place (cached = 1).
 * Live plus unused bytes add up to host_live_bytes and cuda_live_bytes of tm_stats_t.
 * It can grow, as tm_stats_t: tm_get_holders writes rows `row_size` bytes apart (pass
 * sizeof(tm_holder_t); the tm_holders macro below does), fills at most that many bytes of each,
 * sets `size` to what it filled and `version` to TM_HOLDER_VERSION; check `version` before
 * reading fields added after version 3. */
#define TM_HOLDER_VERSION 3

typedef struct tm_holder_t {
    uint32_t size;                  /* bytes of this row the library filled */
    uint32_t version;               /* the library's TM_HOLDER_VERSION */
    char name[64];                  /* the object's file name, NUL-terminated */
    int32_t place;                  /* -1 host, -2 pinned host memory, N >= 0 CUDA device N */
    int32_t cached;                 /* 1: tensormalloc's own cache in that place */
    uint64_t live_bytes;            /* asked for by the live blocks (cached rows: cached now) */
    uint64_t peak_bytes;            /* the most this holder held there at once */
    uint64_t blocks;                /* live blocks */
    uint64_t unused_bytes;          /* handed out beside what was asked (page rounding, a cached
                                       block a little larger than the request) */
} tm_holder_t;

/* Writes up to `capacity` rows, `row_size` bytes apart, biggest first, every holder its own row,
 * and returns how many rows there are (call again with more room when that is more than
 * `capacity`). `out` may be NULL when capacity is 0; a `row_size` under 8 writes nothing. The
 * table names up to 511 holders at once (the rows of unloaded libraries that hold nothing are
 * reused); more are counted in the "unknown" row (the exit report says how many).
 * A block is charged to the shared object whose code called the malloc family (or operator
 * new, or a hook that names its library), by a call or by a tail call: a wrapper such as
 * xmalloc() is its library's whether it calls malloc and returns or jumps to it (`return
 * malloc(n);` at -O2). Only a wrapper reached through a function pointer that ends in a tail
 * call is invisible (its caller is then charged). */
size_t tm_get_holders(tm_holder_t *out, size_t capacity, size_t row_size);

/* The call of the headers before TM_HOLDER_VERSION, kept for programs built against them: it
 * writes rows of the first layout below (96 bytes), so it never writes past an array of either
 * earlier layout (a program built against the header with unused_bytes and no size gets those
 * rows misread: rebuild it). New code calls tm_holders(out, capacity), the macro, which is
 * tm_get_holders. */
typedef struct tm_holder_v1_t {
    char name[64];
    int32_t place;
    int32_t cached;
    uint64_t live_bytes;
    uint64_t peak_bytes;
    uint64_t blocks;
} tm_holder_v1_t;
size_t (tm_holders)(tm_holder_v1_t *out, size_t capacity);
#define tm_holders(out, capacity) tm_get_holders((out), (capacity), sizeof(tm_holder_t))

/* PyTorch's pluggable allocator for CUDA memory, from the device pool:
 * torch.cuda.memory.CUDAPluggableAllocator("libtensormalloc.so", "tm_cuda_alloc", "tm_cuda_free").
 * `stream` is a cudaStream_t. Blocks freed on a stream are reused on it with no synchronization. */
void *tm_cuda_alloc(ptrdiff_t size, int device, void *stream);
void tm_cuda_free(void *ptr, ptrdiff_t size, int device, void *stream);
/* tm_cuda_alloc whose blocks are charged to a hook's library in the holders table: torch's, or
 * `hook`'s (1 numpy, 2 torch, 3 cupy, 4 numba, 5 jax; anything else: the caller's own). */
void *tm_cuda_alloc_torch(ptrdiff_t size, int device, void *stream);
void *tm_cuda_alloc_as(ptrdiff_t size, int device, void *stream, int hook);
/* tm_cuda_alloc_torch for tensormalloc.torch.enable(): a request the device cannot hold throws
 * PyTorch's c10::OutOfMemoryError (torch.OutOfMemoryError in Python) instead of returning NULL,
 * which PyTorch's pluggable allocator would keep as a tensor at address 0. x86-64; elsewhere NULL. */
void *tm_cuda_alloc_torch_raising(ptrdiff_t size, int device, void *stream);
/* What tm_cuda_alloc_torch_raising throws in this process: 3 c10::OutOfMemoryError,
 * 2 std::bad_alloc (no libc10.so), 1 nothing (no C++ runtime: NULL and one stderr line). */
int tm_cuda_oom_raises(void);

/* numpy's data-memory handler (NEP 49), for the Python package: tm_numpy_handler is a
 * PyDataMem_Handler named "tensormalloc", installed in a capsule named tm_numpy_capsule_name
 * ("mem_handler") with PyDataMem_SetHandler; its four functions are these. */
struct tm_numpy_handler_s;
extern const struct tm_numpy_handler_s tm_numpy_handler;
extern const char tm_numpy_capsule_name[12];
void *tm_numpy_malloc(void *ctx, size_t size);
void *tm_numpy_calloc(void *ctx, size_t count, size_t size);
void *tm_numpy_realloc(void *ctx, void *ptr, size_t size);
void tm_numpy_free(void *ctx, void *ptr, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* TENSORMALLOC_H */
