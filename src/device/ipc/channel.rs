//! The channel that carries exported chunks' memory to a peer (Note [IPC of expandable segments]
//! in device/pool/exports.rs): a Unix stream socket in the abstract namespace, named after the
//! user and the exporting process, listened on by a thread of the exporter started at its first
//! export of an expandable block (never before: a process that exports none makes no socket and
//! no thread). A peer connects, checks with the kernel that the exporter named by its handle is at
//! the other end, and asks for the descriptors of the block's chunks a batch at a time, naming
//! the registry entry and token of its handle; the exporter serves only peers of its own user, and
//! only while that entry is its own, live, and names a block still live and exported under it.
//! No daemon, no ptrace rights (pidfd_getfd, which PyTorch uses, needs them, and a child cannot
//! take its parent's descriptors under Yama's default or Docker's default seccomp profile). Every
//! wait is bounded on both sides. Wire format and names here; the socket calls are sys's.

use crate::sys::kept::Kept;
use super::handle::{ChunkRun, Handle};
use crate::sys::unix_socket::{self, Peer, MAX_FDS};
use crate::sys::{clock, files, process, shared_memory, thread};
use core::ffi::c_int;
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicU8, Ordering::{AcqRel, Acquire, Release}};

/// How long a peer waits for the exporter per message, and the exporter for a peer.
const PEER_WAIT_NS: u64 = 5_000_000_000;
const SERVE_WAIT_NS: u64 = 1_000_000_000;

const REQUEST_MAGIC: u64 = u64::from_le_bytes(*b"tmIPCrq1");
const ANSWER_MAGIC: u64 = u64::from_le_bytes(*b"tmIPCan1");

/// What a peer asks: the descriptors of `count` chunks from the `first`-th on of the block its
/// handle (registry entry, token, size) names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub entry: u32,
    pub token: u64,
    pub size: u64,
    pub first: u64,
    pub count: u32,
}

impl Request {
    fn encode(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        let words = [REQUEST_MAGIC, u64::from(self.entry), self.token, self.size, self.first | u64::from(self.count) << 48];
        for (dst, w) in out.chunks_exact_mut(8).zip(words) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8; 40]) -> Option<Request> {
        let word = |k: usize| bytes.get(8 * k..8 * k + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        let last = word(4)?;
        let r = Request { entry: u32::try_from(word(1)?).ok()?, token: word(2)?, size: word(3)?, first: last & ((1 << 48) - 1), count: (last >> 48) as u32 };
        (word(0)? == REQUEST_MAGIC && (1..=MAX_FDS as u32).contains(&r.count)).then_some(r)
    }
}

/// An answer's status.
const SENT: u32 = 0;
const NOT_LIVE: u32 = 1;

fn answer(status: u32, count: usize) -> [u8; 16] {
    let mut out = [0u8; 16];
    let words = [ANSWER_MAGIC, u64::from(status) | (count as u64) << 32];
    for (dst, w) in out.chunks_exact_mut(8).zip(words) {
        dst.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// (status, count) of an answer; None for bytes that are not one.
fn parse_answer(bytes: &[u8; 16]) -> Option<(u32, usize)> {
    let word = |k: usize| bytes.get(8 * k..8 * k + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let w = word(1)?;
    (word(0)? == ANSWER_MAGIC).then_some((w as u32, (w >> 32) as usize))
}

/// The socket's abstract name for user `uid`'s exporting process `pid`, whose channel took
/// `nonce`: an abstract name is anyone's to bind, so a name another process could know in
/// advance (uid and pid alone) could be held first by another user, and every export refused.
pub fn socket_name(uid: u32, pid: u32, nonce: u64, out: &mut [u8; 64]) -> &[u8] {
    let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
    let (uid, pid) = (files::decimal(u64::from(uid), &mut a), files::decimal(u64::from(pid), &mut b));
    let mut hex = [0u8; 16];
    for (k, d) in hex.iter_mut().enumerate() {
        let digit = ((nonce >> (60 - 4 * k)) & 15) as u8;
        *d = if digit < 10 { b'0' + digit } else { b'a' + digit - 10 };
    }
    let mut n = 0;
    for (slot, &c) in out.iter_mut().zip(b"tensormalloc-ipc-".iter().chain(uid).chain(b"-").chain(pid).chain(b"-").chain(&hex)) {
        *slot = c;
        n += 1;
    }
    out.get(..n).unwrap_or(&[])
}

/// How many names the channel tries before it gives up (each taken: another process holds it).
const NAME_TRIES: usize = 8;

/// Listens on the first free name of `tries` nonces (`next` gives each, never 0): the
/// listener and its nonce, or the last errno.
fn listen_on_fresh_name(uid: u32, pid: u32, mut next: impl FnMut() -> u64, tries: usize) -> Result<(i32, u64), i32> {
    let mut last = libc::EADDRINUSE;
    for _ in 0..tries {
        let nonce = next().max(1);
        let mut buf = [0u8; 64];
        match unix_socket::listen(socket_name(uid, pid, nonce, &mut buf)) {
            Ok(fd) => return Ok((fd, nonce)),
            Err(libc::EADDRINUSE) => last = libc::EADDRINUSE,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// The nonce this process's channel listens under (0: it serves none).
pub fn name_nonce() -> u64 {
    NONCE.load(Acquire)
}

static NONCE: AtomicU64 = AtomicU64::new(0);

/// What the serving thread answers with (the device layer's `exported_fds`, set by the route):
/// duplicates of the descriptors of the chunks from the `first`-th on of `run`'s block, exported
/// under registry entry `entry`, into `out`; how many; None when that block is no longer live.
pub type FdsFn = fn(&ChunkRun, u32, u64, &mut [i32]) -> Option<usize>;

const UNTRIED: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const UNAVAILABLE: u8 = 3;

static SERVER: AtomicU8 = AtomicU8::new(UNTRIED);
/// The socket peers connect to (Note [Descriptors the program may close] in sys/kept.rs).
static LISTENER: Kept = Kept::new();
/// Why the server could not start: the errno (0: no thread).
static WHY_NOT: AtomicI32 = AtomicI32::new(0);
static FDS: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Why this process cannot serve its exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The socket was refused (the errno: EADDRINUSE when another process holds our name).
    Socket(i32),
    /// No thread could be started.
    NoThread,
}

/// Serves this process's exports of expandable blocks from now on (a socket and a thread, made
/// at the first call); why not when it cannot (the caller refuses the export and says why).
pub fn serve(fds: FdsFn) -> Result<(), Unavailable> {
    FDS.store(fds as *mut (), Release);
    loop {
        match SERVER.load(Acquire) {
            RUNNING => return Ok(()),
            UNAVAILABLE => {
                let e = WHY_NOT.load(Acquire);
                return Err(if e == 0 { Unavailable::NoThread } else { Unavailable::Socket(e) });
            }
            UNTRIED if SERVER.compare_exchange(UNTRIED, STARTING, AcqRel, Acquire).is_ok() => {
                let outcome = match listen_on_fresh_name(process::user_id(), process::id(), shared_memory::random_u64, NAME_TRIES) {
                    Err(e) => Err(e),
                    Ok((listener, nonce)) => {
                        NONCE.store(nonce, Release);
                        let listener = LISTENER.keep(listener);
                        static SERVING: thread::Named<fn() -> !> = thread::Named { name: c"tensormalloc-ip", main: serve_forever };
                        if thread::spawn(&SERVING) {
                            Ok(())
                        } else {
                            LISTENER.forget();
                            let _ = files::close(listener);
                            Err(0)
                        }
                    }
                };
                if let Err(e) = outcome {
                    WHY_NOT.store(e, Release);
                }
                SERVER.store(if outcome.is_ok() { RUNNING } else { UNAVAILABLE }, Release);
            }
            _ => clock::pause(),
        }
    }
}

fn serve_forever() -> ! {
    loop {
        let listener = LISTENER.checked();
        if listener < 0 {
            // The program closed our socket (and its number may name one of its own now): no
            // more serving; exports from here on are refused, saying why.
            WHY_NOT.store(libc::EBADF, Release);
            SERVER.store(UNAVAILABLE, Release);
            loop {
                clock::sleep_ns(1 << 50);
            }
        }
        match unix_socket::accept(listener) {
            Ok(conn) => {
                serve_peer(conn);
                let _ = files::close(conn);
            }
            // Out of descriptors or memory for a moment: try again a little later.
            Err(_) => clock::sleep_ns(10_000_000),
        }
    }
}

/// Answers one peer's requests until it closes, stops answering, or is not of our user.
fn serve_peer(conn: i32) {
    if unix_socket::peer(conn).is_none_or(|p| p.uid != process::user_id()) {
        return;
    }
    let fds_fn = FDS.load(Acquire);
    if fds_fn.is_null() {
        return;
    }
    // SAFETY: only `serve` stores here, an `FdsFn`.
    let fds_fn = unsafe { core::mem::transmute::<*mut (), FdsFn>(fds_fn) };
    loop {
        let mut bytes = [0u8; 40];
        if unix_socket::recv(conn, &mut bytes, &mut [], SERVE_WAIT_NS).is_err() {
            return;
        }
        let Some(r) = Request::decode(&bytes) else { return };
        let mut fds = [-1i32; MAX_FDS];
        let out = fds.get_mut(..r.count as usize).unwrap_or(&mut []);
        let run = super::lookup_own(r.entry, r.token, r.size).and_then(|p| ChunkRun::decode(&p.real));
        let sent = run.and_then(|run| fds_fn(&run, r.entry, r.first, out));
        let given = out.get(..sent.unwrap_or(0)).unwrap_or(&[]);
        let status = if sent.is_some() { SENT } else { NOT_LIVE };
        let ok = unix_socket::send(conn, &answer(status, given.len()), given, SERVE_WAIT_NS);
        for &fd in given {
            let _ = files::close(fd);
        }
        if ok.is_err() {
            return;
        }
    }
}

/// Why a peer could not have an exported block's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// The block is no longer live (freed since): its handle opens nothing.
    NotLive,
    /// The exporter could not be reached or did not answer (the errno; 0: it closed).
    Unreachable(i32),
    /// Another process than the handle's exporter holds its name (squatted).
    WrongPeer(Peer),
    /// The caller's `map` refused a descriptor (its code).
    Map(c_int),
}

/// A peer's side: the descriptors of the `chunks` chunks of handle `h`'s block, from its
/// exporter, each given to `map(index, fd)` in order and closed after.
pub fn fetch(h: &Handle, chunks: u64, mut map: impl FnMut(u64, i32) -> Result<(), c_int>) -> Result<(), Fetch> {
    let me = process::user_id();
    let mut buf = [0u8; 64];
    let conn = unix_socket::connect(socket_name(me, h.pid, h.channel, &mut buf), PEER_WAIT_NS).map_err(Fetch::Unreachable)?;
    let result = (|| {
        match unix_socket::peer(conn) {
            Some(p) if p == (Peer { pid: h.pid, uid: me }) => {}
            Some(p) => return Err(Fetch::WrongPeer(p)),
            None => return Err(Fetch::Unreachable(0)),
        }
        let mut first = 0u64;
        while first < chunks {
            let count = (chunks - first).min(MAX_FDS as u64) as u32;
            let r = Request { entry: h.entry, token: h.token, size: h.size, first, count };
            unix_socket::send(conn, &r.encode(), &[], PEER_WAIT_NS).map_err(Fetch::Unreachable)?;
            let mut bytes = [0u8; 16];
            let mut fds = [-1i32; MAX_FDS];
            let n = unix_socket::recv(conn, &mut bytes, &mut fds, PEER_WAIT_NS).map_err(Fetch::Unreachable)?;
            let got = fds.get(..n).unwrap_or(&[]);
            let outcome = match parse_answer(&bytes) {
                Some((SENT, k)) if k == count as usize && n == k => Ok(()),
                Some((NOT_LIVE, 0)) => Err(Fetch::NotLive),
                _ => Err(Fetch::Unreachable(EPROTO)),
            };
            let mut mapped = outcome;
            for (k, &fd) in got.iter().enumerate() {
                if mapped.is_ok() {
                    mapped = map(first + k as u64, fd).map_err(Fetch::Map);
                }
                let _ = files::close(fd);
            }
            mapped?;
            first += u64::from(count);
        }
        Ok(())
    })();
    let _ = files::close(conn);
    result
}

/// EPROTO: an answer that is not one of ours.
const EPROTO: i32 = 71;

/// In a forked child: the parent's listener is not ours to serve (no thread of ours here); a
/// child that exports starts its own, under its own name.
pub fn after_fork_in_child() {
    // Unless the program closed it and reused the number.
    let listener = LISTENER.take();
    if listener >= 0 {
        let _ = files::close(listener);
    }
    NONCE.store(0, Release);
    SERVER.store(UNTRIED, Release);
    WHY_NOT.store(0, Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_survive_their_bytes_and_garbage_is_refused() {
        let r = Request { entry: 4094, token: 0xdead_beef_cafe, size: 64 << 20, first: 64, count: 33 };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        assert_eq!(Request::decode(&Request { count: 0, ..r }.encode()), None);
        assert_eq!(Request::decode(&Request { count: MAX_FDS as u32 + 1, ..r }.encode()), None, "more than one message carries");
        assert_eq!(Request::decode(&[0; 40]), None);
        assert_eq!(parse_answer(&answer(SENT, 33)), Some((SENT, 33)));
        assert_eq!(parse_answer(&[7; 16]), None);
        let mut buf = [0u8; 64];
        assert_eq!(socket_name(1000, 4242, 0x0123_4567_89ab_cdef, &mut buf), b"tensormalloc-ipc-1000-4242-0123456789abcdef");
    }

    #[test]
    fn a_name_another_process_holds_is_passed_over_for_a_fresh_one() {
        let (uid, pid) = (process::user_id(), 0x7fff_fff0 - process::id() % 1000);
        let mut buf = [0u8; 64];
        let held = unix_socket::listen(socket_name(uid, pid, 0xaaaa, &mut buf)).expect("a free abstract name");
        let mut nonces = [0xaaaa, 0xbbbb].into_iter();
        let (fd, nonce) = listen_on_fresh_name(uid, pid, || nonces.next().unwrap_or(0xcccc), NAME_TRIES).expect("the second name");
        assert_eq!(nonce, 0xbbbb);
        let again = listen_on_fresh_name(uid, pid, || 0xaaaa, 3);
        assert_eq!(again, Err(libc::EADDRINUSE), "every name tried is held: the errno, no listener");
        for f in [held, fd] {
            let _ = files::close(f);
        }
    }
}
