//! Serving a request: the alloc loop over the pool's decisions (a hit, a synchronization, a new
//! segment or range, chunks to map), with the cache given back and the neighbours asked when
//! the device is full, and what the program is told about free memory (cached bytes count).

use super::DeviceLayer;
use crate::backing::{DeviceError, DeviceRuntime};
use crate::device::fallback::{self, Fallback};
use crate::device::pool::cap::largest_request_of_a_new_pool;
use crate::device::pool::{stream_tag, Alloc, DevicePool, MAX_POOLED_BYTES, SYNCED};
use crate::record;
use crate::record::holders::{device_place, Birth};
use crate::record::stats::timed;
use crate::backing::MAX_DEVICES;

/// Bounds the alloc loop: hit, sync, segment, release-and-retry, ask-and-retry, and a little slack.
const MAX_STEPS: usize = 8;

/// One step of the alloc loop: the pool's decision, with what a new segment's step needs to know
/// from the same lock (whether it fits the cap; the generation a reset would change).
struct Step {
    decision: Alloc,
    fits_cap: bool,
    /// A new segment would fit the cap were the cache given back (else giving it back is no use).
    could_fit_cap: bool,
    generation: u64,
    /// Note [Expandable segments]: the pool's chunk size, 0 for classic segments. A new segment
    /// is then a reserved range, a whole number of chunks (its memory comes chunk by chunk, and
    /// the cap applies to the chunks).
    chunk_bytes: u64,
    /// The pool lives in another context than the request's (Note [Context lifetime]).
    other_context: bool,
    /// A whole free segment would serve the request, carved, should new memory be refused.
    whole_fit: bool,
}

impl Step {
    fn decide(p: &mut DevicePool, ctx: u64, size: usize, tag: u64, birth: Birth, may: Allowed) -> Step {
        let other_context = !p.serves(ctx);
        let mut decision = if other_context { Alloc::Untracked } else { p.alloc_deciding(size as u64, tag, birth, may.sync, may.carve_whole) };
        let whole_fit = !may.carve_whole && matches!(decision, Alloc::NeedSegment { .. }) && p.whole_segment_fits(size as u64, tag);
        let chunk_bytes = p.chunk_bytes();
        let (fits_cap, could_fit_cap) = match decision {
            Alloc::NeedSegment { len, .. } if chunk_bytes == 0 && !p.fits_cap(len) => match p.capped_segment_for(size as u64) {
                // Note [What the cap leaves]: a segment of its own size where the carved one is refused.
                Some(own) if own < len && p.fits_cap(own) => {
                    decision = Alloc::NeedSegment { len: own, small: false };
                    (true, true)
                }
                own => (false, own.unwrap_or(len).min(len) <= p.limit_bytes()),
            },
            _ => (true, true),
        };
        Step { decision, fits_cap, could_fit_cap, generation: p.generation(), chunk_bytes, other_context, whole_fit }
    }
}

/// What a step may do that the program did not ask for.
#[derive(Clone, Copy)]
struct Allowed {
    /// Synchronize to reuse blocks freed on streams (Note [Graph captures under way]).
    sync: bool,
    /// Carve a whole free segment much larger than the request (Note [Whole idle segments]).
    carve_whole: bool,
}


impl<R: DeviceRuntime> DeviceLayer<R> {

    /// cudaMalloc: a block of `size` bytes on the current device, for `holder` (a holder word,
    /// Note [Holders]).
    pub fn malloc(&self, size: usize, holder: u64) -> Result<usize, DeviceError> {
        timed(&self.stats.phases.malloc, || {
            let device = self.runtime.current_device()?;
            // Note [Graph captures under way]: what the runtime alone may refuse, the driver answers.
            if self.allocation_is_the_drivers() {
                return self.passthrough_malloc(device, size);
            }
            self.alloc_on(device, size, SYNCED, holder)
        })
    }

    /// The pluggable allocator's alloc: `device` may differ from the current one.
    pub fn malloc_on_stream(&self, size: usize, device: i32, stream: usize, holder: u64) -> Result<usize, DeviceError> {
        timed(&self.stats.phases.malloc, || self.malloc_on_stream_untimed(size, device, stream, holder))
    }

    pub(super) fn malloc_on_stream_untimed(&self, size: usize, device: i32, stream: usize, holder: u64) -> Result<usize, DeviceError> {
        self.with_device(device, || self.alloc_on(device, size, stream_tag(stream), holder))
    }

    /// A request of `size` bytes on the current device failed for good (`cap_refused`: the cap
    /// refused it), asked by `holder` (0 for a caller that never retries): one event, with the
    /// driver's free and total memory asked once.
    pub fn out_of_memory(&self, size: usize, cap_refused: bool, holder: u64) {
        let Ok(device) = self.runtime.current_device() else { return };
        let Some(index) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else { return };
        let mut e = record::OutOfMemory { place: device_place(index), request_bytes: size as u64, ..Default::default() };
        if let Ok((free, total)) = self.runtime.mem_info() {
            if size > total && !cap_refused {
                return; // more than the device holds: a probe, not a shortage (as on the host)
            }
            (e.free_bytes, e.total_bytes) = (free as u64, total as u64);
        }
        e.cap_bytes = cap_refused.then(|| self.cap_bytes(index));
        e.capture_kept_cache = self.capturing();
        e.caller_retries = holder != 0 && record::holders::frees_and_retries(holder);
        record::out_of_memory(&e);
    }

    /// Serves a request from `device`'s pool, which must be the current device.
    pub(super) fn alloc_on(&self, device: i32, size: usize, tag: u64, holder: u64) -> Result<usize, DeviceError> {
        let Some(pool) = self.pool(device) else { return self.passthrough_malloc(device, size) };
        // Note [Context lifetime]: a block of another context's segment would be unusable here.
        // No context current yet (a thread's first call): the runtime binds one at the segment's
        // allocation, or, when the pool has an owner already, at this request passed through.
        let mut ctx = self.runtime.current_context();
        let mut released = false;
        let mut asked = false;
        let mut mapped = false;
        // Note [Graph captures under way]: no synchronization of ours during a capture.
        let mut may = Allowed { sync: true, carve_whole: false };
        // The pool's answer taken under the lock that added a segment, for the next step.
        let mut carried: Option<Step> = None;
        // A fallback seen under the pool's lock, said after it.
        let mut fallback_seen: Option<Fallback> = None;
        for _ in 0..MAX_STEPS {
            let step = match carried.take() {
                Some(step) => step,
                None => {
                    let birth = Birth { ns: (self.clock)(), holder };
                    Step::decide(&mut pool.lock(), ctx, size, tag, birth, may)
                }
            };
            match step.decision {
                Alloc::Hit { addr, size } => {
                    let found = if mapped { record::Found::Miss } else { record::Found::Hit };
                    record::alloc(Self::block(device as usize, addr, size, holder, tag), found);
                    return Ok(addr as usize);
                }
                Alloc::Untracked => {
                    // A size past what any device holds is the driver's to refuse, not a fallback.
                    if step.other_context {
                        fallback::say(Fallback::OtherContext { device });
                    } else if size as u64 <= MAX_POOLED_BYTES {
                        fallback::say(Fallback::TablesFull { device });
                    }
                    return self.passthrough_malloc(device, size);
                }
                Alloc::NeedSync => match self.unasked() {
                    Some(_call) => {
                        let began = (self.clock)();
                        self.synchronize()?;
                        pool.lock().mark_synced_before(began);
                    }
                    None => may.sync = false,
                },
                Alloc::NeedMap { addr, size } => {
                    self.map_block(device, pool, addr, size)?;
                    self.join_neighbours(device);
                    record::alloc(Self::block(device as usize, addr, size, holder, tag), record::Found::Miss);
                    return Ok(addr as usize);
                }
                Alloc::NeedSegment { len, small } if step.chunk_bytes != 0 => {
                    // Note [Expandable segments]: address space only; chunks come with the blocks.
                    let len = self.range_len(len, small, step.chunk_bytes);
                    let addr = match self.runtime.reserve(len) {
                        Ok(addr) => addr,
                        Err(e) => {
                            self.runtime.clear_last_error();
                            // The first range refused: the pool goes on with classic segments.
                            let classic = pool.lock().fall_back_to_classic();
                            fallback::say(Fallback::Reservation { device, code: e.code(), classic });
                            if classic {
                                continue;
                            }
                            return self.passthrough_malloc(device, size);
                        }
                    };
                    if ctx == 0 {
                        ctx = self.runtime.current_context();
                    }
                    let birth = Birth { ns: (self.clock)(), holder };
                    let mut p = pool.lock();
                    // Threads whose first requests came at once each reserved a range: one that
                    // another added meanwhile may serve this request, and ours goes back (more
                    // than MAX_RANGES threads would otherwise leave requests unpooled).
                    if p.generation() == step.generation {
                        let again = Step::decide(&mut p, ctx, size, tag, birth, may);
                        if !matches!(again.decision, Alloc::NeedSegment { .. }) {
                            drop(p);
                            let _ = self.runtime.unreserve(addr, len);
                            carried = Some(again);
                            continue;
                        }
                    }
                    if p.generation() != step.generation || !p.bind(ctx) || !p.add_range(addr, len, small) {
                        let (other_context, full) = (!p.serves(ctx), p.expandable() && p.generation() == step.generation);
                        drop(p);
                        // Address space nobody uses: back to the driver.
                        let _ = self.runtime.unreserve(addr, len);
                        if other_context {
                            fallback::say(Fallback::OtherContext { device });
                        } else if full {
                            fallback::say(Fallback::RangesFull { device });
                        }
                        return self.passthrough_malloc(device, size);
                    }
                    carried = Some(Step::decide(&mut p, ctx, size, tag, birth, may));
                }
                Alloc::NeedSegment { len, small } => {
                    if !step.fits_cap {
                        if !released && step.could_fit_cap && self.release_cached_unasked(device as usize, pool)? {
                            released = true;
                            continue;
                        }
                        if step.whole_fit {
                            may.carve_whole = true;
                            continue;
                        }
                        pool.lock().stats.oom_failures += 1;
                        return Err(DeviceError::CapReached);
                    }
                    match self.runtime_malloc(len as usize) {
                        Ok(addr) => {
                            mapped = true;
                            // The runtime may have made a context current for this very call.
                            if ctx == 0 {
                                ctx = self.runtime.current_context();
                            }
                            let birth = Birth { ns: (self.clock)(), holder };
                            let added = {
                                let mut p = pool.lock();
                                // A reset meanwhile freed this segment with its context: drop it.
                                // Another context bound the pool meanwhile: give it back.
                                if p.generation() != step.generation {
                                    true
                                } else if p.bind(ctx) && p.add_segment(addr as u64, len, small) {
                                    carried = Some(Step::decide(&mut p, ctx, size, tag, birth, may));
                                    true
                                } else {
                                    fallback_seen = Some(if p.serves(ctx) { Fallback::TablesFull { device } } else { Fallback::OtherContext { device } });
                                    false
                                }
                            };
                            if !added {
                                if let Some(f) = fallback_seen {
                                    fallback::say(f);
                                }
                                self.runtime_free(addr)?;
                                return self.passthrough_malloc(device, size);
                            }
                            record::segment(device_place(device as usize), addr as u64, len, true);
                            self.join_neighbours(device);
                        }
                        Err(DeviceError::OutOfMemory) if !released && self.could_hold(len as usize) && !self.capturing() => {
                            // The failed call left an error for cudaGetLastError; we recover.
                            self.runtime.clear_last_error();
                            pool.lock().stats.oom_retries += 1;
                            self.release_cached_unasked(device as usize, pool)?;
                            released = true;
                        }
                        Err(DeviceError::OutOfMemory) if !asked && self.could_hold(len as usize) && self.ask_neighbours(device) => {
                            self.runtime.clear_last_error();
                            pool.lock().stats.oom_retries += 1;
                            asked = true;
                        }
                        Err(DeviceError::OutOfMemory) if step.whole_fit => {
                            self.runtime.clear_last_error();
                            may.carve_whole = true;
                        }
                        Err(e) => {
                            if e == DeviceError::OutOfMemory {
                                pool.lock().stats.oom_failures += 1;
                            }
                            return Err(e);
                        }
                    }
                }
            }
        }
        Err(DeviceError::OutOfMemory)
    }

    /// How much address space to reserve for a range that must hold `need` bytes (Note
    /// [Expandable segments]): twice the device's memory for large blocks, a quarter of it for
    /// small ones (address space is cheap, and a range never moves), at least `need`, a whole
    /// number of the pool's chunks.
    pub(super) fn range_len(&self, need: u64, small: bool, chunk: u64) -> u64 {
        let total = self.runtime.mem_info().map_or(1 << 30, |(_, total)| total as u64).max(1 << 30);
        // At most 512 GiB a range (the chunk table tracks 2 TiB per pool): more ranges come as needed.
        let wanted = if small { total / 4 } else { total.saturating_mul(2) }.min(1 << 39);
        wanted.max(need).div_ceil(chunk).saturating_mul(chunk)
    }

    /// A request the pool does not serve (another context, full tables): the runtime's, retried
    /// once after our cache on that device is given back when it is out of memory.
    pub(super) fn passthrough_malloc(&self, device: i32, size: usize) -> Result<usize, DeviceError> {
        self.stats.passthrough.add(1);
        match self.runtime_malloc(size) {
            Err(DeviceError::OutOfMemory) if self.could_hold(size) && (self.give_back(device) > 0 || self.ask_neighbours(device)) => {
                self.runtime.clear_last_error();
                self.runtime_malloc(size)
            }
            other => other,
        }
    }

    /// Whether the current device could hold `size` bytes at all: a request past its memory
    /// leaves our cache alone (emptying it would lose the cache and gain nothing).
    pub(super) fn could_hold(&self, size: usize) -> bool {
        self.runtime.mem_info().map_or(true, |(_, total)| size <= total)
    }

    /// cudaMemGetInfo with our cached bytes counted as free (and the cap applied).
    pub fn mem_info(&self) -> Result<(usize, usize), DeviceError> {
        let (free, total) = self.runtime.mem_info()?;
        let device = self.runtime.current_device()?;
        let Ok(index) = usize::try_from(device) else { return Ok((free, total)) };
        Ok((self.available(index, free, total), total))
    }

    /// What `device` has for the program when the driver says `free` of `total` are free: the
    /// segments we would give back for a request count as free (not the free parts of partly
    /// used ones, which no large request could get), and the cap applies. A request of that
    /// many bytes succeeds: the cache given back, the driver serves it.
    pub(super) fn available(&self, device: usize, free: usize, total: usize) -> usize {
        let Some(pool) = self.pools().get(device) else { return free };
        let pool = pool.lock();
        if !pool.is_ready() {
            // Note [What the cap leaves]: the cap the pool will have, before its first segment.
            let cap = self.cap_for(total as u64);
            return match self.strategy() {
                Some(strategy) if cap != u64::MAX => (free as u64).min(largest_request_of_a_new_pool(strategy, cap)) as usize,
                _ => free,
            };
        }
        // Note [Graph captures under way]: the cache is not given back during a capture.
        let releasable = if self.capturing() { 0 } else { pool.releasable_bytes() };
        // Note [What the cap leaves]: the device's room counts as the cap's does (a request's
        // segment is rounded up from its size).
        let room = pool.room_under_cap(releasable).map_or(free as u64 + releasable, |cap_room| cap_room.min(free as u64 + releasable));
        let mut free = pool.largest_request_within(room);
        if pool.expandable() && pool.has_unsynced_free() {
            // Note [What the cap leaves]: a block may start inside a chunk.
            let chunk = pool.chunk_bytes().max(1);
            free = (free / chunk).saturating_sub(1) * chunk;
        }
        free.min(total as u64) as usize
    }
}
