//! What happened to memory, recorded where it happens. The layers call one function per event
//! (`alloc`, `free`, `resize`, `forgotten`, `segment`, `out_of_memory`), once, from one place
//! each; the event goes from here into the per-thread scopes (`scopes`), who holds each block
//! (`holders`), the ring of recent events for the snapshot (`history`), the trace file's ring
//! (`trace`) and, under TENSORMALLOC_STATS, the process's mapped counters (`ledger`); a host
//! block's rows and history go through the host cache's `HostBook` instead. Counters
//! for people live in `stats`. Nothing here calls a layer, a route or a
//! report: the out-of-memory report is a listener the shim side registers.
//
// Note [One recording point]
// Every figure that follows a live block (scopes, the holders table, the history ring, the
// trace) changes here, with the same length in and out (mapped lengths for host blocks, block
// sizes for device and pinned blocks), so they add up to one another and to the layers' own
// live figures. Those the policy decides by (the host cache's working set, the pool's reserved
// and live bytes, its cap) stay with the layer that decides: the layer changes them beside its
// one call here.
//
// Note [Host records under the cache lock]
// Each record of a block is a few locked read-modify-writes on shared figures: three on the
// holder's row, one on the history ring's head. A large malloc/free pair made eight of them,
// 8 ns each even with one thread, on top of the four of the cache lock: a third of the pair.
// The host layer takes its cache lock once per call anyway, and nothing else writes host rows:
// so a host block's row is written by the `HostBook` the cache keeps under that lock, with
// plain loads and stores (the holders' `Writers::Serialized`), and its event too, stamped with
// the time the layer read (the history's host ring, whose head is an atomic add: a block a
// thread moves to or from its slot records its event without the lock, Note [A thread's own
// slot] in host/thread_slots.rs). The rest of its record (the ledger, the scopes, the trace,
// which may create a file) is `alloc`'s, `free`'s, ... below, called after the lock is let go,
// and skips what the book wrote. Device and pinned blocks keep the locked adds: their pools
// have locks of their own (per device, and the pinned one).

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub mod history;
pub mod holders;
pub mod ledger;
pub mod scopes;
pub mod stats;
pub mod trace;

use holders::{Writers, PLACE_HOST, PLACE_PINNED};

/// A block as every record sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// holders::PLACE_HOST, PLACE_PINNED or device_place(device).
    pub place: u8,
    pub addr: u64,
    /// What the block takes: its mapped length (host) or its size (device, pinned).
    pub bytes: u64,
    /// What the program asked for (the holders table counts it; the rest of `bytes` is
    /// handed out beside it, unused).
    pub asked: u64,
    /// Its holder word (Note [Holders]).
    pub holder: u64,
    /// The pool's stream tag; 0 for none.
    pub stream: u64,
}

impl Block {
    pub const fn host(addr: u64, bytes: u64, asked: u64, holder: u64) -> Self {
        Block { place: PLACE_HOST, addr, bytes, asked, holder, stream: 0 }
    }
}

/// How a block was found, for the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Reused from a cache.
    Hit,
    /// Newly mapped (host) or carved from a new segment (device).
    Miss,
    /// Gathered from the pages of cached blocks (host, Note [Gathering pages]).
    Grown,
}

impl Found {
    const fn trace_outcome(self) -> u8 {
        match self {
            Found::Hit => trace::HIT,
            Found::Miss => trace::MISS,
            Found::Grown => trace::GROWN,
        }
    }
}

/// The trace's kind and device byte for a place; None for pinned blocks, which it does not follow.
const fn trace_kind(place: u8) -> Option<(u8, u8)> {
    match place {
        PLACE_HOST => Some((trace::KIND_HOST, 0)),
        PLACE_PINNED => None,
        device => Some((trace::KIND_DEVICE, device - holders::device_place(0))),
    }
}

/// The holders' rows and history of host blocks, written under the host cache's lock (Note
/// [Host records under the cache lock]).
pub struct HostBook(());

impl HostBook {
    /// # Safety
    /// At most one book records at a time: the process's host layer keeps its one book under its
    /// cache lock. (Test layers, several in one process, may lose counts of each other's rows.)
    pub const unsafe fn new() -> Self {
        HostBook(())
    }

    /// A host block handed out, at `now_ns` (the coarse clock).
    pub fn alloc(&mut self, b: Block, now_ns: u64) {
        if let Some(h) = holders::table_to_write() {
            h.on_alloc(b.holder, PLACE_HOST, b.asked, b.bytes, Writers::Serialized);
        }
        Self::event(history::ALLOC, &b, now_ns);
    }

    /// A host block given back by the program.
    pub fn free(&mut self, b: Block, now_ns: u64) {
        if let Some(h) = holders::table() {
            h.on_free(b.holder, PLACE_HOST, b.asked, b.bytes, Writers::Serialized);
        }
        Self::event(history::FREE, &b, now_ns);
    }

    /// A host block that kept its holder through a resize (see `resize`).
    pub fn resize(&mut self, old: Block, new: Block, now_ns: u64) {
        if let Some(h) = holders::table() {
            h.on_resize(old.holder, PLACE_HOST, (old.asked, old.bytes), (new.asked, new.bytes), Writers::Serialized);
        }
        Self::event(history::FREE, &old, now_ns);
        Self::event(history::ALLOC, &new, now_ns);
    }

    /// A live host block forgotten (see `forgotten`): to its row and the history, a free.
    pub fn forgotten(&mut self, b: Block, now_ns: u64) {
        self.free(b, now_ns);
    }

    /// A block freed into its thread's slot leaves it for the cache: its row follows (its
    /// event was recorded at its free, `freed_to_slot`).
    pub fn left_slot(&mut self, b: Block) {
        if let Some(h) = holders::table() {
            h.on_free(b.holder, PLACE_HOST, b.asked, b.bytes, Writers::Serialized);
        }
    }

    /// A block taken back from a slot as `new` by another holder or for another size: the rows
    /// move (its events are `taken_from_slot`'s).
    pub fn changed_hands(&mut self, old: Block, new: Block) {
        if let Some(h) = holders::table_to_write() {
            h.on_free(old.holder, PLACE_HOST, old.asked, old.bytes, Writers::Serialized);
            h.on_alloc(new.holder, PLACE_HOST, new.asked, new.bytes, Writers::Serialized);
        }
    }

    fn event(action: u8, b: &Block, time_ns: u64) {
        history::record_host(&history::HistoryEvent { time_ns, addr: b.addr, size: b.bytes, holder: b.holder, stream: 0, action, place: PLACE_HOST });
    }
}

/// Whether a host block's event goes anywhere beyond its book and the history: the ledger
/// (TENSORMALLOC_STATS's file), a scope ever opened, the trace. Three loads, so that a host
/// malloc/free pair with none of them on makes no call here (Note [Host records under the
/// cache lock]).
#[inline(always)]
fn host_extras_on() -> bool {
    ledger::on() || scopes::ever_opened() || trace::enabled()
}

/// A block handed out; `found` says how. A host block's row and history are its book's.
#[inline(always)]
pub fn alloc(b: Block, found: Found) {
    if b.place != PLACE_HOST || host_extras_on() {
        alloc_recorded(b, found);
    }
}

/// A block given back by the program.
#[inline(always)]
pub fn free(b: Block) {
    if b.place != PLACE_HOST || host_extras_on() {
        free_recorded(b);
    }
}

fn alloc_recorded(b: Block, found: Found) {
    ledger::on_alloc(b.place, b.bytes, found);
    if b.place != PLACE_HOST {
        retry_served(b.place, b.bytes);
        if let Some(h) = holders::table_to_write() {
            h.on_alloc(b.holder, b.place, b.asked, b.bytes, Writers::Many);
        }
        history::record(history::ALLOC, b.place, b.addr, b.bytes, b.holder, b.stream);
    }
    if let Some((kind, device)) = trace_kind(b.place) {
        scopes::on_alloc(b.bytes);
        trace::record(kind, trace::OP_ALLOC, found.trace_outcome(), device, b.asked, b.addr, b.holder);
    }
}

fn free_recorded(b: Block) {
    ledger::on_free(b.place, b.bytes);
    if b.place != PLACE_HOST {
        if let Some(h) = holders::table() {
            h.on_free(b.holder, b.place, b.asked, b.bytes, Writers::Many);
        }
        history::record(history::FREE, b.place, b.addr, b.bytes, b.holder, b.stream);
    }
    if let Some((kind, device)) = trace_kind(b.place) {
        scopes::on_free(b.bytes);
        trace::record(kind, trace::OP_FREE, trace::HIT, device, b.bytes, b.addr, b.holder);
    }
}

/// A block that kept its holder through a resize (in place or moved by the kernel): for the
/// history and the trace, a free of the old block and an alloc of the new one. (A copying
/// resize records an alloc and a free.)
/// A host block freed into its thread's slot at `now_ns` (Note [A thread's own slot] in
/// host/thread_slots.rs): a free, but for its holder's row, which follows when it leaves the
/// slot (`HostBook::left_slot`, `HostBook::changed_hands`).
#[inline(always)]
pub fn freed_to_slot(b: Block, now_ns: u64) {
    free(b);
    HostBook::event(history::FREE, &b, now_ns);
}

/// A host block taken back from its thread's slot at `now_ns`, a hit.
#[inline(always)]
pub fn taken_from_slot(b: Block, now_ns: u64) {
    HostBook::event(history::ALLOC, &b, now_ns);
    alloc(b, Found::Hit);
}

pub fn resize(old: Block, new: Block) {
    ledger::on_resize(old.place, old.bytes, new.bytes);
    if old.place != PLACE_HOST {
        if let Some(h) = holders::table() {
            h.on_resize(old.holder, old.place, (old.asked, old.bytes), (new.asked, new.bytes), Writers::Many);
        }
        history::record(history::FREE, old.place, old.addr, old.bytes, old.holder, old.stream);
        history::record(history::ALLOC, new.place, new.addr, new.bytes, new.holder, new.stream);
    }
    if let Some((kind, device)) = trace_kind(old.place) {
        scopes::on_free(old.bytes);
        scopes::on_alloc(new.bytes);
        trace::record(kind, trace::OP_FREE, trace::HIT, device, old.bytes, old.addr, old.holder);
        trace::record(kind, trace::OP_ALLOC, trace::HIT, device, new.asked, new.addr, new.holder);
    }
}

/// A live block freed by someone else (its context destroyed or reset freed it): it leaves the
/// holders table, and, unless pinned, the history's timeline (the snapshot must not keep it).
/// No scope or trace event: the program did not free it.
pub fn forgotten(b: Block) {
    ledger::on_forgotten(b.place, b.bytes);
    if b.place != PLACE_HOST {
        if let Some(h) = holders::table() {
            h.on_free(b.holder, b.place, b.asked, b.bytes, Writers::Many);
        }
        if b.place != PLACE_PINNED {
            history::record(history::FREE, b.place, b.addr, b.bytes, b.holder, b.stream);
        }
    }
}

/// A device segment mapped into a pool (`mapped`) or given back.
pub fn segment(place: u8, addr: u64, bytes: u64, mapped: bool) {
    ledger::on_segment(place, bytes, mapped);
    let action = if mapped { history::SEGMENT_MAP } else { history::SEGMENT_UNMAP };
    history::record(action, place, addr, bytes, 0, 0);
}

/// A request that failed for good for want of memory, with what the place could say of itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutOfMemory {
    pub place: u8,
    pub request_bytes: u64,
    /// Device: the driver's total and free memory (0, 0 when it cannot say). Host: the
    /// mapping limit (u64::MAX when none) and 0.
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// The pool's cap, when the cap is what refused.
    pub cap_bytes: Option<u64>,
    /// Device: a graph capture under way kept the pool from giving its cache back.
    pub capture_kept_cache: bool,
    /// The caller frees its own cache and asks again, as PyTorch's caching allocator does: the
    /// report waits for that retry (Note [A report the program recovers from] in report/oom.rs).
    pub caller_retries: bool,
}

/// Who hears of an out-of-memory event (the report, registered at load); a `fn(&OutOfMemory)`.
static OUT_OF_MEMORY_LISTENER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// A device failure whose report waits for the program's retry (Note [A report the program
/// recovers from] in report/oom.rs): its place in the top byte, its request below; 0: none.
static AWAITING_RETRY: AtomicU64 = AtomicU64::new(0);
const REQUEST_MASK: u64 = (1 << 56) - 1;

/// The report of a failure of `request` bytes on `place` waits: a device block of at least that
/// size served there before it is printed means the program recovered.
pub fn await_retry(place: u8, request: u64) {
    AWAITING_RETRY.store(u64::from(place) << 56 | request.min(REQUEST_MASK), Ordering::Release);
}

/// Whether the awaited retry came (or nothing was awaited); forgets what was awaited.
pub fn retry_came() -> bool {
    AWAITING_RETRY.swap(0, Ordering::AcqRel) == 0
}

fn retry_served(place: u8, bytes: u64) {
    let awaited = AWAITING_RETRY.load(Ordering::Relaxed);
    if awaited != 0 && (awaited >> 56) as u8 == place && bytes >= awaited & REQUEST_MASK {
        let _ = AWAITING_RETRY.compare_exchange(awaited, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Sets who hears of out-of-memory events; called once at load.
pub fn on_out_of_memory(listener: fn(&OutOfMemory)) {
    OUT_OF_MEMORY_LISTENER.store(listener as *mut (), Ordering::Release);
}

/// A request that failed for good: into the history (with the free bytes where an event's
/// address goes, PyTorch's `device_free`), then to the listener. Called with no lock held.
pub fn out_of_memory(e: &OutOfMemory) {
    ledger::on_failure(e.place);
    history::record(history::OOM, e.place, e.free_bytes, e.request_bytes, 0, 0);
    let listener = OUT_OF_MEMORY_LISTENER.load(Ordering::Acquire);
    if !listener.is_null() {
        // The report's writes inside malloc are no cancellation point (Note [Cancellation
        // points] in sys/thread.rs).
        // SAFETY: only `on_out_of_memory` stores here, a `fn(&OutOfMemory)`.
        crate::sys::cancel::cancel_held(|| unsafe { core::mem::transmute::<*mut (), fn(&OutOfMemory)>(listener)(e) });
    }
}
