//! Who holds the memory (Note [Holders]): for each holder (the shared object whose code asked,
//! or a hook that names its library) and each place (host, pinned, every device), the live
//! bytes, their peak and the live blocks. Lock-free counters, updated at each large allocation
//! and free by the layers' recording points; read by the reports. Names are never resolved here:
//! a holder is a key (sys/caller.rs names it at report time).

use crate::sys::mapped_on_use::MappedOnUse;
use crate::backing::MAX_DEVICES;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

// Note [Holders]
// Every large host block, device block and pinned block carries one word: the return address
// of the call into our entry point (bits 0..48) and its holder's id (bits 48..64). The holder is
// the object that return address lies in (its load base is the key: `_dl_find_object`, lock-free
// and allocation-free, asked once per call site and cached here), or, for hooks whose caller is
// ctypes or a framework's plug-in point, a fixed key naming the library (HOOK_KEYS). At a free
// the word tells which row to take the bytes from, so the rows always add up to the layers'
// totals: each row counts the bytes its holder asked for (live) and what was handed out beside
// them (unused: a host block's mapped length past the request), from the same recording points;
// live plus unused is the layers' figure. Names (dladdr) are looked up only for a report.
// The table has MAX_HOLDERS - 1 rows; a holder past them is counted under "unknown", and the
// reports say how many were (`refused`). A library unloaded (dlclose, route/objects.rs) is
// retired: its row keeps its blocks under its name, saved at the unload, and an object loaded
// later at the same address is a new holder.
// A call site keeps its holder until its object is unloaded by dlclose (then it is retired, see
// below); an object unloaded some other way (the loader's own, never) would leave its row named
// after whatever object starts at its base then ("(unloaded object)" when none does).
// A row whose object is unloaded with nothing live (or whose last block is freed after) is free
// for the next holder: a plugin loaded and unloaded 10,000 times takes one row, not the table.
// Freed keys become TOMBSTONE, which a lookup passes over (the keys after it in its probe
// sequence stay found) and a new key takes; a retired row with live blocks is freed when the
// table is full and its blocks are gone. The call sites' cache holds 8192 sets of two entries:
// 2,048 call sites in rotation stay in it but for a few percent (a miss reads the loader's
// tables, a few hundred nanoseconds, no system call).

/// Places: host blocks, pinned host blocks (cudaMallocHost), then one per device.
pub const PLACE_HOST: u8 = 0;
pub const PLACE_PINNED: u8 = 1;
pub const PLACES: usize = 2 + MAX_DEVICES;

/// The place of `device`'s blocks.
pub const fn device_place(device: usize) -> u8 {
    (2 + device) as u8
}

/// Holders the table names; further ones are counted as UNKNOWN.
pub const MAX_HOLDERS: usize = 512;
/// The holder of blocks whose caller is unknown, or new once the table is full.
pub const UNKNOWN: u16 = 0;

/// Keys of the hooks that name their library (below any load base, which is page-aligned and
/// nonzero): tm_numpy_* (numpy's handler), tm_cuda_alloc_torch, and tm_cuda_alloc_as's tags.
pub const HOOK_KEYS: [(u64, &str); 5] = [(1, "numpy"), (2, "torch"), (3, "cupy"), (4, "numba"), (5, "jax")];
pub const KEY_NUMPY: u64 = 1;
pub const KEY_TORCH: u64 = 2;
/// Code in no loaded object (a JIT's): one holder for all of it.
pub const KEY_ANONYMOUS: u64 = 15;

const CALLER_BITS: u32 = 48;
const CALLER_MASK: u64 = (1 << CALLER_BITS) - 1;
/// Sets of two entries in the call sites' cache.
const CALLER_SETS: usize = 8192;

/// A call site's set: the address mixed (murmur3's finalizer) so that sites spaced evenly in
/// code spread evenly over the sets.
fn caller_set(caller: u64) -> usize {
    let mut x = caller;
    x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    (x ^ (x >> 33)) as usize % CALLER_SETS
}

/// Marks the key of an unloaded object: no load base has this bit.
const RETIRED: u64 = 1 << 63;
/// The key of a freed row: a lookup passes over it, a new key takes it.
const TOMBSTONE: u64 = u64::MAX;
/// Bytes of a retired holder's name kept.
pub const RETIRED_NAME_BYTES: usize = 56;

/// The holder id in a holder word.
pub const fn id_of(word: u64) -> u16 {
    (word >> CALLER_BITS) as u16
}

/// The return address in a holder word (0 when the caller is not known).
pub const fn caller_of(word: u64) -> usize {
    (word & CALLER_MASK) as usize
}

#[derive(Default)]
struct Row {
    live: AtomicU64,
    peak: AtomicU64,
    blocks: AtomicU64,
    unused: AtomicU64,
}

impl Row {
    const fn new() -> Self {
        Row { live: AtomicU64::new(0), peak: AtomicU64::new(0), blocks: AtomicU64::new(0), unused: AtomicU64::new(0) }
    }

    /// Adds `delta` (two's complement for a decrease) to `figure`: a locked add where many
    /// threads may write the row; a load and a store where one lock serializes its writers.
    fn add(figure: &AtomicU64, delta: u64, writers: Writers) -> u64 {
        match writers {
            Writers::Many => figure.fetch_add(delta, Relaxed).wrapping_add(delta),
            Writers::Serialized => {
                let now = figure.load(Relaxed).wrapping_add(delta);
                figure.store(now, Relaxed);
                now
            }
        }
    }

    /// A read first: below the peak (the steady state) costs no locked instruction.
    fn raise_peak(&self, live: u64, writers: Writers) {
        if live > self.peak.load(Relaxed) {
            match writers {
                Writers::Many => {
                    self.peak.fetch_max(live, Relaxed);
                }
                Writers::Serialized => self.peak.store(live, Relaxed),
            }
        }
    }

    fn on_alloc(&self, asked: u64, bytes: u64, writers: Writers) {
        let asked = asked.min(bytes);
        let live = Self::add(&self.live, asked, writers);
        self.raise_peak(live, writers);
        Self::add(&self.blocks, 1, writers);
        Self::add(&self.unused, bytes - asked, writers);
    }

    fn on_free(&self, asked: u64, bytes: u64, writers: Writers) {
        let asked = asked.min(bytes);
        Self::add(&self.live, asked.wrapping_neg(), writers);
        Self::add(&self.blocks, 1u64.wrapping_neg(), writers);
        Self::add(&self.unused, (bytes - asked).wrapping_neg(), writers);
    }

    fn on_resize(&self, (old_asked, old_bytes): (u64, u64), (new_asked, new_bytes): (u64, u64), writers: Writers) {
        let (old_asked, new_asked) = (old_asked.min(old_bytes), new_asked.min(new_bytes));
        let live = Self::add(&self.live, new_asked.wrapping_sub(old_asked), writers);
        if new_asked > old_asked {
            self.raise_peak(live, writers);
        }
        Self::add(&self.unused, (new_bytes - new_asked).wrapping_sub(old_bytes - old_asked), writers);
    }
}

/// Who may change a place's rows at once (Note [Host records under the cache lock] in
/// record/mod.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writers {
    /// Any thread, at any time: locked read-modify-writes.
    Many,
    /// Only the holder of the one lock every writer of the place takes: plain loads and stores
    /// (readers, who take no lock, may see a figure a call old).
    Serialized,
}

/// When a block was handed out, and to whom (a holder word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Birth {
    pub ns: u64,
    pub holder: u64,
}

impl Birth {
    /// Handed out at `ns` to an unknown holder.
    pub const fn at(ns: u64) -> Self {
        Birth { ns, holder: 0 }
    }
}

/// One holder's figures in one place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HolderRow {
    pub id: u16,
    pub place: u8,
    /// What the holder's live blocks were asked for.
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub blocks: u64,
    /// Handed out beside what was asked (page and huge-page rounding, a cached block a little
    /// larger than the request).
    pub unused_bytes: u64,
}

pub struct Holders {
    /// The key of each id (0: free; id UNKNOWN's stays 0).
    keys: [AtomicU64; MAX_HOLDERS],
    rows: [[Row; PLACES]; MAX_HOLDERS],
    /// Return address -> id, two ways per set: `caller | id << 48`, two loads per lookup.
    callers: [[AtomicU64; 2]; CALLER_SETS],
    /// Keys refused a row: the table was full (Note [Holders]).
    refused: AtomicU64,
    /// The names of retired holders (unloaded objects), by id: length, then bytes.
    retired_names: crate::sys::lock::Lock<[(u8, [u8; RETIRED_NAME_BYTES]); MAX_HOLDERS]>,
}

impl Default for Holders {
    fn default() -> Self {
        Self::new()
    }
}

impl Holders {
    pub const fn new() -> Self {
        Holders {
            keys: [const { AtomicU64::new(0) }; MAX_HOLDERS],
            rows: [const { [const { Row::new() }; PLACES] }; MAX_HOLDERS],
            callers: [const { [const { AtomicU64::new(0) }; 2] }; CALLER_SETS],
            refused: AtomicU64::new(0),
            retired_names: crate::sys::lock::Lock::new([(0, [0; RETIRED_NAME_BYTES]); MAX_HOLDERS]),
        }
    }

    /// The id of `key`, given one if new; UNKNOWN for key 0 or once every id is taken.
    pub fn id_of_key(&self, key: u64) -> u16 {
        if key == 0 || key == TOMBSTONE {
            return UNKNOWN;
        }
        if let Some(id) = self.find_or_claim(key) {
            return id;
        }
        // Full: rows of unloaded objects whose blocks are all gone make room.
        if self.free_retired_rows() > 0 {
            if let Some(id) = self.find_or_claim(key) {
                return id;
            }
        }
        self.refused.fetch_add(1, Relaxed);
        UNKNOWN
    }

    /// One pass of the probe sequence of `key`: its id, or a free row claimed for it (the first
    /// tombstone passed, else the empty key that ends the sequence); None when full.
    fn find_or_claim(&self, key: u64) -> Option<u16> {
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % (MAX_HOLDERS - 1);
        let mut first_free = None;
        for probe in 0..MAX_HOLDERS - 1 {
            let id = 1 + (start + probe) % (MAX_HOLDERS - 1);
            let Some(slot) = self.keys.get(id) else { break };
            // A read first: a known key (every hook's allocation) takes no locked instruction.
            match slot.load(Relaxed) {
                k if k == key => return Some(id as u16),
                TOMBSTONE => {
                    first_free.get_or_insert(id);
                }
                0 => {
                    first_free.get_or_insert(id);
                    break;
                }
                _ => {}
            }
        }
        let id = first_free?;
        let slot = self.keys.get(id)?;
        let was = slot.load(Relaxed);
        if was == key {
            return Some(id as u16);
        }
        if was != 0 && was != TOMBSTONE {
            return self.find_or_claim_again(key);
        }
        match slot.compare_exchange(was, key, Relaxed, Relaxed) {
            Ok(_) => Some(id as u16),
            Err(theirs) if theirs == key => Some(id as u16),
            // Another key took it meanwhile: look again.
            Err(_) => self.find_or_claim_again(key),
        }
    }

    #[cold]
    fn find_or_claim_again(&self, key: u64) -> Option<u16> {
        (1..MAX_HOLDERS).find(|&id| self.keys.get(id).is_some_and(|k| k.load(Relaxed) == key)).map(|id| id as u16).or_else(|| {
            (1..MAX_HOLDERS).find_map(|id| {
                let slot = self.keys.get(id)?;
                let was = slot.load(Relaxed);
                ((was == 0 || was == TOMBSTONE) && slot.compare_exchange(was, key, Relaxed, Relaxed).is_ok()).then_some(id as u16)
            })
        })
    }

    /// Whether holder `id` holds nothing in any place.
    fn is_empty(&self, id: usize) -> bool {
        self.rows.get(id).is_some_and(|places| places.iter().all(|r| r.blocks.load(Relaxed) == 0 && r.live.load(Relaxed) == 0))
    }

    /// Frees row `id`: its figures are zeroed and its key becomes TOMBSTONE.
    fn free_row(&self, id: usize) {
        if let Some(places) = self.rows.get(id) {
            for r in places {
                r.live.store(0, Relaxed);
                r.peak.store(0, Relaxed);
                r.blocks.store(0, Relaxed);
                r.unused.store(0, Relaxed);
            }
        }
        if let Some(k) = self.keys.get(id) {
            k.store(TOMBSTONE, Relaxed);
        }
    }

    /// Frees the rows of unloaded objects that hold nothing now; returns how many.
    fn free_retired_rows(&self) -> usize {
        let mut freed = 0;
        for id in 1..MAX_HOLDERS {
            let key = self.keys.get(id).map_or(0, |k| k.load(Relaxed));
            if key != TOMBSTONE && key & RETIRED != 0 && self.is_empty(id) {
                self.free_row(id);
                freed += 1;
            }
        }
        freed
    }

    /// Forgets every call site cached for holder `id`.
    fn forget_call_sites(&self, id: usize) {
        for c in self.callers.iter().flatten() {
            if usize::from(id_of(c.load(Relaxed))) == id {
                c.store(0, Relaxed);
            }
        }
    }

    /// The object that started at `start` was unloaded: its call sites are forgotten (code
    /// loaded there later is another holder); its row is freed if it holds nothing, else keeps
    /// its blocks under `name`.
    pub fn retire(&self, start: u64, name: &[u8]) {
        let Some(id) = (1..MAX_HOLDERS).find(|&id| self.keys.get(id).is_some_and(|k| k.load(Relaxed) == start)) else { return };
        if self.is_empty(id) {
            self.free_row(id);
            self.forget_call_sites(id);
            return;
        }
        {
            let mut names = self.retired_names.lock();
            if let Some((len, bytes)) = names.get_mut(id) {
                let kept = name.len().min(RETIRED_NAME_BYTES);
                if let (Some(d), Some(s)) = (bytes.get_mut(..kept), name.get(..kept)) {
                    d.copy_from_slice(s);
                }
                *len = kept as u8;
            }
        }
        if let Some(k) = self.keys.get(id) {
            k.store(start | RETIRED, Relaxed);
        }
        self.forget_call_sites(id);
    }

    /// The saved name of a retired holder (an unloaded object), given to `f`.
    pub fn retired_name<T>(&self, id: u16, f: impl FnOnce(Option<&[u8]>) -> T) -> T {
        let key = self.key(id);
        if key & RETIRED == 0 || key == TOMBSTONE {
            return f(None);
        }
        let names = self.retired_names.lock();
        f(names.get(usize::from(id)).map(|(len, bytes)| bytes.get(..usize::from(*len)).unwrap_or(&[])))
    }

    /// Holders (call sites or hooks) counted as unknown because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// The key of `id` (0 for UNKNOWN or an id never given).
    pub fn key(&self, id: u16) -> u64 {
        self.keys.get(usize::from(id)).map_or(0, |k| k.load(Relaxed))
    }

    /// The holder word of a block asked for from `caller`: `key_of` (the holder of a return
    /// address) is asked once per call site.
    pub fn holder_of_call(&self, caller: usize, key_of: impl FnOnce(usize) -> u64) -> u64 {
        let caller = caller as u64 & CALLER_MASK;
        if caller == 0 {
            return 0;
        }
        let Some([first, second]) = self.callers.get(caller_set(caller)) else { return 0 };
        for way in [first, second] {
            let cached = way.load(Relaxed);
            if cached & CALLER_MASK == caller {
                return cached;
            }
        }
        let word = caller | u64::from(self.id_of_key(key_of(caller as usize))) << CALLER_BITS;
        // The newest in the first way, the one it pushes out in the second (each entry names
        // its own call site: a reader racing these stores finds its site or misses).
        let pushed = first.swap(word, Relaxed);
        if pushed != 0 {
            second.store(pushed, Relaxed);
        }
        word
    }

    /// The holder word of a block asked for by a hook naming its library (`key`), from `caller`.
    pub fn holder_of_hook(&self, caller: usize, key: u64) -> u64 {
        caller as u64 & CALLER_MASK | u64::from(self.id_of_key(key)) << CALLER_BITS
    }

    fn row(&self, word: u64, place: u8) -> Option<&Row> {
        self.rows.get(usize::from(id_of(word)))?.get(usize::from(place))
    }

    /// A block of `bytes`, `asked` of them asked for, by `writers`.
    pub fn on_alloc(&self, word: u64, place: u8, asked: u64, bytes: u64, writers: Writers) {
        if let Some(r) = self.row(word, place) {
            r.on_alloc(asked, bytes, writers);
        }
    }

    /// The block of `on_alloc`'s figures given back.
    pub fn on_free(&self, word: u64, place: u8, asked: u64, bytes: u64, writers: Writers) {
        if let Some(r) = self.row(word, place) {
            r.on_free(asked, bytes, writers);
        }
    }

    /// A block of the holder changed length in place (a realloc that kept it): (asked, bytes)
    /// before and after.
    pub fn on_resize(&self, word: u64, place: u8, old: (u64, u64), new: (u64, u64), writers: Writers) {
        if let Some(r) = self.row(word, place) {
            r.on_resize(old, new, writers);
        }
    }

    /// Empties every holder's row in `place`: its blocks are another process's (the parent's
    /// device and pinned blocks in a forked child).
    pub fn forget_place(&self, place: u8) {
        for places in self.rows.iter() {
            if let Some(r) = places.get(usize::from(place)) {
                r.live.store(0, Relaxed);
                r.peak.store(0, Relaxed);
                r.blocks.store(0, Relaxed);
                r.unused.store(0, Relaxed);
            }
        }
    }

    /// In a forked child: a report of the parent's that was reading the retired names at the
    /// fork is not in this process (Note [Locks a child inherits] in sys/lock.rs); the names
    /// stay, a child's holders being its parent's.
    pub fn after_fork_in_child(&self) {
        // SAFETY: the child's fork handler; the names are whole unless a retirement was writing
        // one at the fork, which leaves that one name cut short.
        unsafe { self.retired_names.free_in_child() };
    }

    /// Every row that has ever held memory, by id then place.
    pub fn for_each_row(&self, mut f: impl FnMut(&HolderRow)) {
        for (id, places) in self.rows.iter().enumerate() {
            for (place, r) in places.iter().enumerate() {
                let peak = r.peak.load(Relaxed);
                if peak == 0 {
                    continue;
                }
                f(&HolderRow {
                    id: id as u16,
                    place: place as u8,
                    live_bytes: r.live.load(Relaxed),
                    peak_bytes: peak,
                    blocks: r.blocks.load(Relaxed),
                    unused_bytes: r.unused.load(Relaxed),
                });
            }
        }
    }

}

/// The process's table, mapped at its first holder (Note [Tables mapped at first use] in
/// sys/mapped_on_use.rs).
// SAFETY: a zeroed table is an empty one (keys 0, rows 0, a free lock).
static HOLDERS: MappedOnUse<Holders> = unsafe { MappedOnUse::new() };

/// The process's table, if a holder has mapped it.
pub fn table() -> Option<&'static Holders> {
    HOLDERS.get()
}

/// The process's table, mapped now if it was not (None: refused).
pub fn table_to_write() -> Option<&'static Holders> {
    HOLDERS.get_or_map()
}

/// Every row of the process's table.
pub fn for_each_row(f: impl FnMut(&HolderRow)) {
    if let Some(h) = table() {
        h.for_each_row(f);
    }
}

/// Who asked for a block, as the entry points pass it down: the return address of the call
/// into us, with a hook's key (HOOK_KEYS) in bits 48..64 when a hook names its library. Its
/// holder word (Note [Holders]) is worked out only for a block that is served: small requests
/// never pay for it. A u64 in registers, so naked entry points can hand it on.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asker(u64);

impl Asker {
    /// A caller we do not know (our own fallbacks, non-x86 exports).
    pub const UNKNOWN: Asker = Asker(0);

    /// A block asked for through a hook that names its library by `key`, called from `caller`.
    pub const fn hook(caller: usize, key: u64) -> Asker {
        Asker(caller as u64 & CALLER_MASK | key << CALLER_BITS)
    }

    /// The holder word of the block this asker is handed.
    pub fn holder(self) -> u64 {
        let caller = self.0 as usize;
        // No table (its mapping refused): every block's holder is unknown, and nothing counts.
        let Some(holders) = table_to_write() else { return 0 };
        match self.0 >> CALLER_BITS {
            0 => holders.holder_of_call(caller, |c| match crate::sys::caller::calling_object(c) {
                Some(start) => start as u64,
                None => KEY_ANONYMOUS,
            }),
            key => holders.holder_of_hook(caller, key),
        }
    }
}

/// What a report says of a holder word, borrowed from the loader (no allocation).
pub struct Description<'a> {
    /// Short: the object file's name without its directory, or the hook's library.
    pub holder: &'a [u8],
    /// The calling object's path (empty when unknown).
    pub object: &'a [u8],
    /// The calling function (empty when the object exports no symbol there).
    pub symbol: &'a [u8],
}

/// Describes a holder word for a report: its holder, and where the call came from.
pub fn describe<T>(word: u64, f: impl FnOnce(&Description) -> T) -> T {
    let key = table().map_or(0, |h| h.key(id_of(word)));
    let caller = caller_of(word);
    let hook = hook_name(key).map(str::as_bytes);
    crate::sys::caller::names(caller, |found| match found {
        Some((object, symbol)) => f(&Description { holder: hook.unwrap_or_else(|| basename(object)), object, symbol }),
        None => f(&Description { holder: hook.unwrap_or(b"unknown"), object: b"", symbol: b"" }),
    })
}

/// Whether the block's caller is PyTorch's CUDA caching allocator (libc10_cuda.so), which meets a
/// failed cudaMalloc by freeing its cache and asking again.
pub fn frees_and_retries(word: u64) -> bool {
    describe(word, |d| d.holder.starts_with(b"libc10_cuda"))
}

/// The short name of holder `id` (its object's file name, or its hook's library).
pub fn holder_name<T>(id: u16, f: impl FnOnce(&[u8]) -> T) -> T {
    let key = table().map_or(0, |h| h.key(id));
    if key == TOMBSTONE {
        return f(b"(unloaded object)");
    }
    if let Some(h) = table().filter(|_| key & RETIRED != 0) {
        return h.retired_name(id, |name| {
            let mut w = crate::sys::stderr::StackWriter::<80>::new();
            let _ = core::fmt::Write::write_fmt(&mut w, format_args!("{} (unloaded)", name.and_then(|n| core::str::from_utf8(n).ok()).unwrap_or("?")));
            f(w.as_bytes())
        });
    }
    if let Some(name) = hook_name(key) {
        return f(name.as_bytes());
    }
    crate::sys::caller::names(key as usize, |found| match found {
        Some((object, _)) => f(basename(object)),
        None => f(if key == 0 { b"unknown" } else { b"(unloaded object)" }),
    })
}

fn basename(path: &[u8]) -> &[u8] {
    path.rsplit(|&c| c == b'/').next().unwrap_or(path)
}

/// The key of a hook named by its number in the C API (`tm_cuda_alloc_as`): HOOK_KEYS' keys;
/// anything else is no hook (0: the caller's own object).
pub fn hook_key(hook: i32) -> u64 {
    u64::try_from(hook).ok().filter(|k| HOOK_KEYS.iter().any(|(key, _)| key == k)).unwrap_or(0)
}

/// The name of a hook's key.
pub fn hook_name(key: u64) -> Option<&'static str> {
    if key == KEY_ANONYMOUS {
        return Some("(code in no object)");
    }
    HOOK_KEYS.iter().find(|(k, _)| *k == key).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_allocs_and_frees_and_keep_their_peak() {
        let h = Holders::new();
        let a = h.holder_of_call(0x40_1234, |_| 0x40_0000);
        let b = h.holder_of_call(0x70_0010, |_| 0x70_0000);
        assert_ne!(id_of(a), id_of(b));
        assert_eq!(caller_of(a), 0x40_1234);
        h.on_alloc(a, PLACE_HOST, 100, 4096, Writers::Many);
        h.on_alloc(a, PLACE_HOST, 50, 50, Writers::Many);
        h.on_alloc(b, device_place(1), 7, 7, Writers::Many);
        h.on_free(a, PLACE_HOST, 100, 4096, Writers::Many);
        let mut rows = vec![];
        h.for_each_row(|r| rows.push(*r));
        assert_eq!(rows.len(), 2);
        let ra = rows.iter().find(|r| r.id == id_of(a)).unwrap();
        assert_eq!((ra.place, ra.live_bytes, ra.peak_bytes, ra.blocks, ra.unused_bytes), (PLACE_HOST, 50, 150, 1, 0), "what was asked");
        assert_eq!(h.key(id_of(a)), 0x40_0000);
        let rb = rows.iter().find(|r| r.id == id_of(b)).unwrap();
        assert_eq!((rb.place, rb.live_bytes), (device_place(1), 7));
    }

    #[test]
    fn a_call_site_is_resolved_once_and_objects_share_an_id() {
        let h = Holders::new();
        let mut asked = 0;
        let w1 = h.holder_of_call(0x40_1000, |_| {
            asked += 1;
            0x40_0000
        });
        let w2 = h.holder_of_call(0x40_1000, |_| {
            asked += 1;
            0x40_0000
        });
        let w3 = h.holder_of_call(0x40_2000, |_| 0x40_0000);
        assert_eq!((w1, asked), (w2, 1));
        assert_eq!(id_of(w1), id_of(w3));
        assert_ne!(w1, w3);
    }

    #[test]
    fn unknown_callers_and_a_full_table_go_to_unknown() {
        let h = Holders::new();
        assert_eq!(h.holder_of_call(0, |_| 5), 0);
        assert_eq!(id_of(h.holder_of_call(0x1000, |_| 0)), UNKNOWN);
        for key in 1..MAX_HOLDERS as u64 {
            assert_ne!(h.id_of_key(key << 12), UNKNOWN);
        }
        assert_eq!(h.id_of_key(0xdead_0000), UNKNOWN);
        assert_eq!(h.refused(), 1, "a full table is counted");
        assert_ne!(h.id_of_key(3 << 12), UNKNOWN, "known keys keep their ids");
    }

    #[test]
    fn resizes_move_live_bytes_and_peak() {
        let h = Holders::new();
        let w = h.holder_of_hook(0x1234, KEY_NUMPY);
        h.on_alloc(w, PLACE_HOST, 10, 4096, Writers::Many);
        h.on_resize(w, PLACE_HOST, (10, 4096), (40, 8192), Writers::Many);
        h.on_resize(w, PLACE_HOST, (40, 8192), (20, 4096), Writers::Many);
        let mut rows = vec![];
        h.for_each_row(|r| rows.push(*r));
        assert_eq!((rows[0].live_bytes, rows[0].peak_bytes, rows[0].blocks, rows[0].unused_bytes), (20, 40, 1, 4076));
        assert_eq!(hook_name(h.key(rows[0].id)), Some("numpy"));
    }

    #[test]
    fn serialized_writers_keep_the_figures_locked_adds_keep() {
        // One sequence of allocs, resizes and frees, one table per kind of writer.
        let figures = |writers| {
            let h = Holders::new();
            let w = h.holder_of_hook(0x1234, KEY_NUMPY);
            h.on_alloc(w, PLACE_HOST, 10, 4096, writers);
            h.on_alloc(w, PLACE_HOST, 3 << 20, 4 << 20, writers);
            h.on_resize(w, PLACE_HOST, (10, 4096), (9000, 12288), writers);
            h.on_free(w, PLACE_HOST, 3 << 20, 4 << 20, writers);
            h.on_resize(w, PLACE_HOST, (9000, 12288), (100, 4096), writers);
            let mut rows = vec![];
            h.for_each_row(|r| rows.push(*r));
            rows
        };
        let serialized = figures(Writers::Serialized);
        assert_eq!(serialized, figures(Writers::Many));
        assert_eq!((serialized[0].live_bytes, serialized[0].peak_bytes, serialized[0].blocks, serialized[0].unused_bytes), (100, (3 << 20) + 9000, 1, 3996));
    }
}

#[cfg(test)]
mod reuse_tests {
    use super::*;

    #[test]
    fn rows_of_unloaded_objects_are_reused_and_the_next_holder_named() {
        let h = Holders::new();
        // 10,000 loads of a plugin at one address, each with a block freed before the unload.
        for cycle in 0..10_000u64 {
            let word = h.holder_of_call(0x7000_1000 + (cycle as usize % 7) * 16, |_| 0x7000_0000);
            assert_ne!(id_of(word), UNKNOWN, "cycle {cycle}");
            h.on_alloc(word, PLACE_HOST, 100, 4096, Writers::Many);
            h.on_free(word, PLACE_HOST, 100, 4096, Writers::Many);
            h.retire(0x7000_0000, b"libplugin.so");
        }
        assert_eq!(h.refused(), 0);
        let mut rows = 0;
        h.for_each_row(|_| rows += 1);
        assert_eq!(rows, 0, "no row left for the unloaded plugin");
        // Plugins at 500 other addresses, each unloaded with nothing live: the table never fills.
        for i in 0..2000u64 {
            let start = 0x1_0000_0000 + i * 0x10_0000;
            let w = h.holder_of_call(start as usize + 64, |_| start);
            assert_ne!(id_of(w), UNKNOWN);
            h.retire(start, b"libp.so");
        }
        let next = h.holder_of_call(0x9000_0040, |_| 0x9000_0000);
        assert_ne!(id_of(next), UNKNOWN);
        assert_eq!(h.key(id_of(next)), 0x9000_0000, "the next library has a row of its own");
    }

    #[test]
    fn a_retired_row_with_live_blocks_keeps_its_name_until_they_are_freed() {
        let h = Holders::new();
        let w = h.holder_of_call(0x7000_1000, |_| 0x7000_0000);
        h.on_alloc(w, PLACE_HOST, 100, 4096, Writers::Many);
        h.retire(0x7000_0000, b"libkept.so");
        assert_eq!(h.retired_name(id_of(w), |n| n.map(<[u8]>::to_vec)), Some(b"libkept.so".to_vec()));
        // Fill the table: the retired row is not taken while its block lives.
        let mut ids = 0;
        for i in 0..(MAX_HOLDERS as u64 * 2) {
            if h.id_of_key(0x10_0000_0000 + (i << 12)) != UNKNOWN {
                ids += 1;
            }
        }
        assert_eq!(ids, MAX_HOLDERS - 2, "every row but UNKNOWN's and the retired one's");
        assert!(h.retired_name(id_of(w), |n| n.is_some()));
        h.on_free(w, PLACE_HOST, 100, 4096, Writers::Many);
        assert_ne!(h.id_of_key(0x20_0000_0000), UNKNOWN, "a full table frees the retired row once its blocks are gone");
    }

    #[test]
    fn keys_after_a_freed_row_in_their_probe_sequence_are_still_found() {
        let h = Holders::new();
        // Keys that collide: same probe start.
        let keys: Vec<u64> = (1..u64::MAX).map(|i| i << 12).filter(|k| (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % (MAX_HOLDERS as u64 - 1) == 3).take(4).collect();
        let ids: Vec<u16> = keys[..3].iter().map(|&k| h.id_of_key(k)).collect();
        h.retire(keys[0], b"first");
        assert_eq!(h.id_of_key(keys[1]), ids[1]);
        assert_eq!(h.id_of_key(keys[2]), ids[2]);
        assert_eq!(h.id_of_key(keys[3]), ids[0], "a new key takes the freed row");
    }

    #[test]
    fn two_thousand_call_sites_stay_cached() {
        let h = Holders::new();
        let asked = std::cell::Cell::new(0);
        let sites: Vec<usize> = (0..2048).map(|i| 0x40_0000 + i * 37).collect();
        for _ in 0..3 {
            for &site in &sites {
                h.holder_of_call(site, |_| {
                    asked.set(asked.get() + 1);
                    0x40_0000
                });
            }
        }
        assert!(asked.get() < 2048 + 2 * 2048 / 20, "{} lookups for 2048 sites over three rounds: more than 5% missed", asked.get());
    }
}
