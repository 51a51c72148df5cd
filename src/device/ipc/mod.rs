//! IPC of pooled blocks that share a segment (Note [IPC] in device/pool/pointers.rs) or lie in an
//! expandable one (Note [IPC of expandable segments] in device/pool/exports.rs): our handle
//! (`handle.rs`), the per-user registry it names (`registry.rs`, mapped here on first use: the
//! user's runtime directory, else /dev/shm, checked as the neighbours' registry is), the segments
//! and chunk runs this process opened for such handles (`opened.rs`), and the socket that carries
//! exported chunks' memory to a peer (`channel.rs`). This file is this process's side:
//! publishing and withdrawing its exports, reading another process's, each way it cannot said
//! once on stderr. The driver calls are the route's (route/cuda/ipc.rs, ipc_chunks.rs).

pub mod channel;
pub mod handle;
pub mod opened;
pub mod registry;

use crate::sys::shared_memory::{self, Refused, SharedFile};
use crate::sys::{files, process};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering::{AcqRel, Acquire, Relaxed, Release}};
use handle::Handle;
pub use registry::Published;
use registry::{Registry, REGISTRY_BYTES};

/// The segments this process opened for handles of ours.
pub static OPENED: opened::Opened = opened::Opened::new();

const UNTRIED: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const UNAVAILABLE: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNTRIED);
static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(core::ptr::null_mut());

fn registry_file() -> SharedFile {
    let mut shm_name = [0u8; 64];
    let mut uid = [0u8; 20];
    let uid = files::decimal(u64::from(process::user_id()), &mut uid);
    let mut n = 0;
    for (slot, &b) in shm_name.iter_mut().zip(b"tensormalloc-".iter().chain(uid).chain(b"-ipc")) {
        *slot = b;
        n += 1;
    }
    SharedFile::locate(b"tensormalloc-ipc", shm_name.get(..n).unwrap_or(&[]))
}

fn text(p: &[u8]) -> &str {
    core::str::from_utf8(p).unwrap_or("(path)")
}

/// The registry, mapped on first use; None, said once, when it cannot be used.
fn registry() -> Option<&'static Registry> {
    if STATE.load(Acquire) == UNTRIED && STATE.compare_exchange(UNTRIED, OPENING, AcqRel, Acquire).is_ok() {
        let file = registry_file();
        let outcome = match file.map(REGISTRY_BYTES).map(|p| p.cast::<Registry>()) {
            // SAFETY: a live shared mapping of REGISTRY_BYTES, never unmapped; every field is an
            // atomic (or padding), so whatever another process wrote there is a valid value.
            Ok(p) if unsafe { (*p).adopt() } => Ok(p),
            Ok(_) => Err(Refused::WrongSize),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(p) => {
                REGISTRY.store(p, Release);
                STATE.store(READY, Release);
            }
            Err(e) => {
                STATE.store(UNAVAILABLE, Release);
                let mut buf = [0u8; 128];
                let why = match e {
                    Refused::OtherUser { .. } => "created by another user (squatted)",
                    Refused::NotPrivate => "others may read or write it",
                    Refused::NotAFile => "not a plain file",
                    Refused::WrongSize => "another version's or damaged",
                    Refused::System(errno) => process::error_text(errno, &mut buf),
                };
                crate::warn_line!(
                    "IPC registry {}: {}; IPC handles of pooled blocks that share a segment or lie in an expandable one are refused (a private runtime directory, XDG_RUNTIME_DIR or /run/user/UID mode 0700, keeps the registry where no one else can create it; TENSORMALLOC_CUDA_POOL=binned gives the driver's own handles)",
                    text(file.path()),
                    why
                );
            }
        }
    }
    if STATE.load(Acquire) != READY {
        return None;
    }
    // SAFETY: stored once, before READY, from a mapping that is never unmapped.
    Some(unsafe { &*REGISTRY.load(Acquire) })
}

/// A non-zero token no earlier export of this entry had.
fn token() -> u64 {
    let mut t = shared_memory::random_u64();
    while t == 0 {
        t = shared_memory::random_u64() | crate::sys::clock::now_ns();
    }
    t
}

/// Publishes an export: the handle of ours for it, and its registry entry; None (said once)
/// when the registry cannot be used or is full.
pub fn publish(what: &Published) -> Option<(Handle, u32)> {
    let reg = registry()?;
    let me = process::id();
    let token = token();
    let started = process::start_ticks();
    // A full table is walked entry by entry, and each judgement costs system calls: the last 16
    // are kept (a table holds the entries of a few processes; ours need none).
    let judged = core::cell::Cell::new([(me, Some(started).filter(|&t| t != 0), true); 16]);
    let next = core::cell::Cell::new(1usize);
    let lives = |pid: u32, started: Option<u64>| {
        let mut seen = judged.get();
        if let Some(&(_, _, verdict)) = seen.iter().find(|j| (j.0, j.1) == (pid, started)) {
            return verdict;
        }
        let verdict = shared_memory::process_lives(pid, started);
        if let Some(slot) = seen.get_mut(next.get() % 16) {
            *slot = (pid, started, verdict);
        }
        judged.set(seen);
        next.set(next.get() + 1);
        verdict
    };
    let Some(entry) = reg.publish(me, started, token, what, lives) else {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Relaxed) {
            crate::warn_line!("IPC registry {}: all {} entries are live exports of this user's; IPC handles of pooled blocks that share a segment or lie in an expandable one are refused until some are freed", text(registry_file().path()), registry::ENTRIES);
        }
        return None;
    };
    Some((Handle { pid: me, entry, token, size: what.size, offset: what.offset, channel: channel::name_nonce() }, entry))
}

/// Says once, at the first handle of ours, that such handles need the preload in the receiver.
pub fn say_ours() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::warn_line!(
            "IPC of pooled blocks that share a segment or lie in an expandable one: their handles are tensormalloc's own, which a process under the preload opens (LD_PRELOAD=libtensormalloc.so); a process without it gets the driver's error. TENSORMALLOC_CUDA_POOL=binned gives every block the driver's own handle (said once)"
        );
    }
}

/// The handle of ours that entry `entry` (ours, still published) stands for.
pub fn handle_of(entry: u32, what: &Published) -> Option<Handle> {
    let me = process::id();
    let token = registry()?.token(entry, me)?;
    Some(Handle { pid: me, entry, token, size: what.size, offset: what.offset, channel: channel::name_nonce() })
}

/// The block entry `entry` names was freed (or its context ended): later opens of its handle
/// fail. No registry mapped: nothing was published.
pub fn withdraw(entry: u32) {
    if STATE.load(Acquire) != READY {
        return;
    }
    if let Some(reg) = registry() {
        let me = process::id();
        if let Some(token) = reg.token(entry, me) {
            reg.withdraw(entry, me, token);
        }
    }
}

/// What this process's own entry `entry` names while live under `token` for a block of `size`
/// bytes (a peer asks for its memory: device/ipc/channel.rs); never creates the registry.
pub fn lookup_own(entry: u32, token: u64, size: u64) -> Option<Published> {
    if STATE.load(Acquire) != READY {
        return None;
    }
    registry()?.lookup(entry, process::id(), token, size)
}

/// What a handle of ours names, for a process that opens it; None (said once) when it names
/// nothing live: a freed block's, another user's, a process's under another runtime directory.
pub fn lookup(h: &Handle) -> Option<Published> {
    let found = registry().and_then(|reg| reg.lookup(h.entry, h.pid, h.token, h.size)).filter(|p| p.offset == h.offset);
    if found.is_none() {
        say_not_live(h);
    }
    found
}

/// Whether the process that exported handle `h` has ended: it runs no more, or its pid names a
/// process that started at another time (Note [A pid given again] in device/neighbours/mod.rs).
pub fn exporter_ended(h: &Handle) -> bool {
    let started = registry().and_then(|reg| reg.publisher_started(h.entry, h.pid, h.token));
    !shared_memory::process_running(h.pid) || !shared_memory::process_lives(h.pid, started)
}

/// Says once that handle `h` names no live block (its open is refused with invalid value).
pub fn say_not_live(h: &Handle) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::warn_line!(
            "cuIpcOpenMemHandle: a tensormalloc handle from process {} names no live block in the IPC registry {} (freed since, or exported by another user or under another XDG_RUNTIME_DIR); refused with invalid value",
            h.pid,
            text(registry_file().path())
        );
    }
}
