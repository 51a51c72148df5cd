//! Which name an output gets (Note [One file per process]): the names a process may take, in
//! order, and the claim that takes the first one free, atomically, for a file made with no name
//! (sys/files.rs). Also where a process's files go when the user gave no path: its user's
//! private runtime directory. The order of names is pure (`candidate`); the rest is system calls.
//
// Note [One file per process]
// Every process of a run may be given one path without `%p` (a Pool's workers, a DataLoader's,
// a script that starts others), and a process may exec itself (same pid). Each file is made with
// no name and then named with linkat, which fails if anything stands at the name, so two
// processes can never end up with one name, however they race (no look, decide, rename). The
// names a process tries, in order:
//   PATH, PATH.PID, PATH.PID.2, PATH.PID.3, ...            (no %p in the file name)
//   PATH with %p = PID, then %p = PID.2, PID.3, ...        (%p in it)
// A forked child of a process with us loaded starts at the second without %p (PATH is its
// parent's).
// A name that is taken is passed over, unless what stands there is a file of ours that no live
// writer holds (each writer holds an exclusive flock on its file for its whole life; a file
// written at exit holds none), that was last written before this process was forked (an
// earlier run's: a rerun takes PATH back), and that this process did not write before an exec
// (the counters and the trace say who wrote them: pid and process start). That file is replaced
// by a rename, made while holding its lock and after checking the name still names it, so two
// processes that both find it stale cannot both take it. A file written since this process was
// forked is its run's (a sibling that ended first, even while this one was still being exec'd:
// 16 processes started at once) and is kept. The fork's time is known to a clock tick (/proc's
// start, 10 ms) and is taken at the tick's start, file times may be a coarse-clock tick behind
// (two of those ticks are allowed): so a rerun forked within about 10 to 20 ms of the previous
// run's last write is taken for its sibling and writes beside PATH, saying so; never the
// reverse. Anything else at a name (a FIFO, a link, another user's file) is never opened for
// writing nor replaced (Note [Files others can reach]).

use super::dir::{self, Dir, Found, Standing, Unnamed};
use super::files::{self, Name, Refused, NAME_MAX_BYTES};

/// A file counts as an earlier run's only when written this long before the claimant started:
/// file times may come from the coarse clock, up to a tick behind the time they stand for (Note
/// [One file per process]); two ticks, at least 2 ms and at most 50 ms.
fn stale_margin_ns() -> u64 {
    let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes one timespec we own.
    let tick = if unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) } == 0 {
        (res.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(res.tv_nsec as u64)
    } else {
        10_000_000
    };
    tick.saturating_mul(2).clamp(2_000_000, 50_000_000)
}

/// How many names past the first are tried.
const NAMES_TRIED: u32 = 64;

/// Who claims, and from where its names start.
#[derive(Clone, Copy, Debug)]
pub struct Claimant {
    pub pid: u32,
    /// When the process started (wall ns, its fork, to a clock tick below): a file written since
    /// is its run's.
    pub started_wall_ns: u64,
    /// A forked child of a process with us loaded: the first name is its parent's.
    pub forked: bool,
}

impl Claimant {
    /// This process, now.
    pub fn this(forked: bool) -> Claimant {
        Claimant { pid: super::process::id(), started_wall_ns: super::process::process_started_wall_ns(), forked }
    }
}

/// Why the first name was passed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassedOver {
    /// The claimant is a forked child.
    Forked,
    /// Another process of the run holds it, or wrote it since this process started.
    Run,
    /// This process's own image before an exec wrote it.
    EarlierImage,
    /// Something stands there that is not a file of ours to replace.
    Other(Refused),
}

/// The name a file was given.
pub struct Claimed {
    name: Name,
    /// Why the first name was not taken (None: it was).
    pub passed_over: Option<PassedOver>,
    /// Which of the names (`candidate`'s k) it is.
    pub index: u32,
}

impl Claimed {
    pub fn name(&self) -> &[u8] {
        let n = self.name.iter().position(|&b| b == 0).unwrap_or(self.name.len());
        self.name.get(..n).unwrap_or(&[])
    }
}

/// A claimed file's path as messages show it: the directory part of the path the user gave (%p
/// in it expanded), then the name the file got.
pub struct Shown {
    buf: [u8; SHOWN_BYTES],
    len: usize,
}

const SHOWN_BYTES: usize = 2 * (NAME_MAX_BYTES + 1);

impl Shown {
    pub fn of(path: &[u8], name: &[u8]) -> Shown {
        let mut out = Shown { buf: [0; SHOWN_BYTES], len: 0 };
        let (dir, _) = files::split(path);
        let mut d = [0u8; NAME_MAX_BYTES + 1];
        let dir_part: &[u8] = if !path.contains(&b'/') {
            b""
        } else {
            files::expand_path(dir, super::process::id(), &mut d).and_then(|n| d.get(..n)).unwrap_or(dir)
        };
        let sep: &[u8] = if dir_part.is_empty() || dir_part.ends_with(b"/") { b"" } else { b"/" };
        for &b in dir_part.iter().chain(sep).chain(name) {
            if let Some(slot) = out.buf.get_mut(out.len) {
                *slot = b;
                out.len += 1;
            }
        }
        out
    }

    pub fn get(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

/// A path kept for messages by a static (the trace's, the counters'), written once before the
/// file it names is published.
pub struct NameSlot {
    buf: core::cell::UnsafeCell<[u8; SHOWN_BYTES]>,
    len: core::sync::atomic::AtomicUsize,
}

// SAFETY: `set` is called by one thread before any reader looks (its callers publish the file
// afterwards with release ordering), and after a fork by the child's one thread.
unsafe impl Sync for NameSlot {}

impl NameSlot {
    pub const fn new() -> Self {
        NameSlot { buf: core::cell::UnsafeCell::new([0; SHOWN_BYTES]), len: core::sync::atomic::AtomicUsize::new(0) }
    }

    /// Keeps `path` (cut to the slot's size). Called by the one thread that claims the file,
    /// before the file is published.
    pub fn set(&self, path: &[u8]) {
        let n = path.len().min(SHOWN_BYTES);
        // SAFETY: the one writer (see the Sync impl); no reader until the file is published.
        if let (Some(dst), Some(src)) = (unsafe { (*self.buf.get()).get_mut(..n) }, path.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.len.store(n, core::sync::atomic::Ordering::Release);
    }

    pub fn get(&self) -> &[u8] {
        let n = self.len.load(core::sync::atomic::Ordering::Acquire);
        // SAFETY: the first n bytes were written before n was published.
        unsafe { (*self.buf.get()).get(..n).unwrap_or(&[]) }
    }
}

impl Default for NameSlot {
    fn default() -> Self {
        Self::new()
    }
}

/// The `k`th name (0: the first) a process `pid` tries for the file name `base` (Note [One file
/// per process]), into `out`; its length, or None when it does not fit.
pub fn candidate(base: &[u8], pid: u32, k: u32, out: &mut [u8; NAME_MAX_BYTES + 1]) -> Option<usize> {
    let mut id = [0u8; 32];
    let mut digits = [0u8; 20];
    let mut at = 0;
    let mut put = |b: u8, id: &mut [u8; 32]| -> Option<()> {
        *id.get_mut(at)? = b;
        at += 1;
        Some(())
    };
    for &d in files::decimal(u64::from(pid), &mut digits) {
        put(d, &mut id)?;
    }
    let has_pid = base.windows(2).any(|w| w == b"%p");
    // The image number: none for the first two names without %p, none for the first with it.
    let image = if has_pid { k + 1 } else { k };
    if image >= 2 {
        put(b'.', &mut id)?;
        let mut digits = [0u8; 20];
        for &d in files::decimal(u64::from(image), &mut digits) {
            put(d, &mut id)?;
        }
    }
    let id = id.get(..at)?;
    *out = [0; NAME_MAX_BYTES + 1];
    let room = out.get_mut(..NAME_MAX_BYTES)?;
    let n = files::expand_with(base, id, room)?;
    if has_pid || k == 0 {
        return Some(n);
    }
    // PATH.ID: the expanded base, a dot, the id.
    let tail = n.checked_add(1 + id.len()).filter(|&end| end <= NAME_MAX_BYTES)?;
    *out.get_mut(n)? = b'.';
    out.get_mut(n + 1..tail)?.copy_from_slice(id);
    Some(tail)
}

/// Gives `file` the first name of `base`'s (a file name in `dir`, `%p` in it the pid) that it may
/// have (Note [One file per process]). `earlier_image` says, of a file found at a name, whether
/// this process wrote it before an exec (what the file says of its writer; never replaced). Err:
/// the system refused (no such directory, no room...), or every name was taken.
pub fn claim(dir: &Dir, base: &[u8], file: &mut Unnamed, who: &Claimant, earlier_image: impl Fn(&Found) -> bool) -> Result<Claimed, Refused> {
    // A forked child's own name, with %p, is its own; without, PATH is its parent's.
    let beside = who.forked && !base.windows(2).any(|w| w == b"%p");
    let mut passed_over = beside.then_some(PassedOver::Forked);
    let first = u32::from(beside);
    for k in first..=NAMES_TRIED {
        let mut name = [0u8; NAME_MAX_BYTES + 1];
        let n = candidate(base, who.pid, k, &mut name).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
        let this = name.get(..n).unwrap_or(&[]);
        // A name emptied between the link and the look is tried again, a few times.
        for _ in 0..3 {
            if file.link(this)? {
                return Ok(Claimed { name, passed_over, index: k });
            }
            let why = match dir::look(dir, this) {
                Standing::Nothing => continue,
                Standing::Other(e) => PassedOver::Other(e),
                Standing::Ours(old) => match take_over(dir, this, &old, file, who, &earlier_image) {
                    Ok(()) => return Ok(Claimed { name, passed_over, index: k }),
                    Err(why) => why,
                },
            };
            passed_over.get_or_insert(why);
            break;
        }
    }
    Err(Refused::Taken)
}

/// Replaces `old`, at `name`, by `file` if no live writer holds it and it was written before the
/// claimant started; else why not.
fn take_over(dir: &Dir, name: &[u8], old: &Found, file: &mut Unnamed, who: &Claimant, earlier_image: &impl Fn(&Found) -> bool) -> Result<(), PassedOver> {
    // The lock is held until `old` is dropped, after the rename: a second claimant that finds
    // the same file stale waits out our lock, then finds the name no longer names it.
    if !old.try_lock() || old.mtime_ns.saturating_add(stale_margin_ns()) >= who.started_wall_ns || !old.is_at(dir, name) {
        return Err(PassedOver::Run);
    }
    if earlier_image(old) {
        return Err(PassedOver::EarlierImage);
    }
    file.replace(name).map_err(PassedOver::Other)
}

/// Puts `file` at `name` in `dir` whatever stood there, as a caller who named the path itself
/// asks (tm_snapshot): a file of ours with one link is replaced; anything else is refused.
pub fn put_in_place(dir: &Dir, name: &[u8], file: &mut Unnamed) -> Result<(), Refused> {
    for _ in 0..4 {
        if file.link(name)? {
            return Ok(());
        }
        match dir::look(dir, name) {
            Standing::Nothing => continue,
            Standing::Other(e) => return Err(e),
            Standing::Ours(old) => {
                if old.is_at(dir, name) {
                    return file.replace(name);
                }
            }
        }
    }
    Err(Refused::Taken)
}

/// The outputs that claim names, for the line a process that writes beside PATH prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Stats,
    Trace,
    Snapshot,
}

/// Says, in one line, that the output at `path` went to `shown` instead, and why.
pub fn say(what: Output, path: &[u8], shown: &[u8], why: PassedOver, forked_from: u32) {
    let own = super::process::id();
    let path = core::str::from_utf8(path).unwrap_or("(path)");
    let actual = core::str::from_utf8(shown).unwrap_or("(path)");
    let (prefix, verb) = match what {
        Output::Stats => ("", "writes its stats"),
        Output::Trace => ("TENSORMALLOC_TRACE: ", "traces"),
        Output::Snapshot => ("TENSORMALLOC_SNAPSHOT_AT_EXIT: ", "writes its snapshot"),
    };
    match (why, what) {
        (PassedOver::Forked, Output::Stats) => crate::warn_line!("process {own}, forked from {forked_from}, writes its stats beside {path}, to {actual}"),
        (PassedOver::Forked | PassedOver::Run, Output::Snapshot) => {
            crate::warn_line!("{prefix}{path} is another process's of this run; process {own} {verb} beside it, to {actual}")
        }
        (PassedOver::Forked | PassedOver::Run, _) => {
            crate::warn_line!("{prefix}{path} is written by another process of this run; process {own} {verb} beside it, to {actual}")
        }
        (PassedOver::EarlierImage, _) => {
            crate::warn_line!("{prefix}{path} is this process's before its exec; process {own} {verb} beside it, to {actual}")
        }
        (PassedOver::Other(e), _) => {
            let mut text = [0u8; 128];
            crate::warn_line!("{prefix}{path}: {}; process {own} {verb} beside it, to {actual}", e.text(&mut text))
        }
    }
}

/// The user's private directory for files nobody named (the mapped counters of
/// TENSORMALLOC_STATS=1): `$XDG_RUNTIME_DIR/tensormalloc` when the session has a runtime
/// directory of this user's, closed to others; else `/tmp/tensormalloc-UID`. Made 0700 if
/// missing (when `create`); refused when it is not a directory of ours closed to others (one another user made
/// first is never used). `path` gets its path, for messages.
pub fn runtime_dir(path: &mut [u8; files::PATH_MAX_BYTES + 1], create: bool) -> Result<(Dir, usize), Refused> {
    let mut xdg: Option<Dir> = None;
    super::env::for_each_with_prefix(b"XDG_RUNTIME_DIR", |name, value| {
        if name == b"XDG_RUNTIME_DIR" && value.first() == Some(&b'/') {
            xdg = Dir::open(value).ok().filter(|d| private_to_us(d.fd())).inspect(|_| {
                let _ = files::joined(value, b"/tensormalloc", path);
            });
        }
    });
    if let Some(parent) = xdg {
        let len = path.iter().position(|&b| b == 0).unwrap_or(0);
        return Dir::private(&parent, b"tensormalloc", create).map(|d| (d, len));
    }
    let mut digits = [0u8; 20];
    let uid = files::decimal(u64::from(super::process::user_id()), &mut digits);
    let mut name = [0u8; 64];
    let prefix = b"tensormalloc-";
    name.get_mut(..prefix.len()).ok_or(Refused::Os(libc::EINVAL))?.copy_from_slice(prefix);
    name.get_mut(prefix.len()..prefix.len() + uid.len()).ok_or(Refused::Os(libc::EINVAL))?.copy_from_slice(uid);
    let name = name.get(..prefix.len() + uid.len()).unwrap_or(&[]);
    *path = [0; files::PATH_MAX_BYTES + 1];
    let len = files::joined(b"/tmp/", name, path).map_or(0, |p| p.len());
    Dir::private(&Dir::open(b"/tmp")?, name, create).map(|d| (d, len))
}

/// Whether the directory open at `fd` is ours and closed to others.
fn private_to_us(fd: i32) -> bool {
    // SAFETY: fstat fills a struct we own.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0) && st.st_uid == super::process::user_id() && st.st_mode & 0o077 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nth(base: &[u8], pid: u32, k: u32) -> String {
        let mut out = [0u8; NAME_MAX_BYTES + 1];
        let n = candidate(base, pid, k, &mut out).unwrap();
        String::from_utf8(out[..n].to_vec()).unwrap()
    }

    #[test]
    fn names_are_tried_in_the_order_of_the_note() {
        assert_eq!([nth(b"s.json", 42, 0), nth(b"s.json", 42, 1), nth(b"s.json", 42, 2), nth(b"s.json", 42, 3)], ["s.json", "s.json.42", "s.json.42.2", "s.json.42.3"]);
        assert_eq!([nth(b"s.%p.json", 42, 0), nth(b"s.%p.json", 42, 1), nth(b"s.%p.json", 42, 2)], ["s.42.json", "s.42.2.json", "s.42.3.json"]);
        assert_eq!(nth(b"100%%.%p", 7, 0), "100%.7");
        let mut out = [0u8; NAME_MAX_BYTES + 1];
        assert_eq!(candidate(&[b'x'; 250], 1234567, 1, &mut out), None, "past NAME_MAX");
    }

    fn tmpdir(tag: &str) -> (std::path::PathBuf, Dir) {
        let d = std::env::temp_dir().join(format!("tm-claim-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let dir = Dir::open(d.to_str().unwrap().as_bytes()).unwrap();
        (d, dir)
    }

    fn new_file(dir: &Dir, text: &[u8]) -> Unnamed {
        let f = Unnamed::create(dir, b"s.json").unwrap();
        files::write_all(f.fd(), text).unwrap();
        f
    }

    #[test]
    fn a_claim_takes_the_first_free_name_and_never_a_live_or_recent_one() {
        let (d, dir) = tmpdir("order");
        let started = super::super::clock::wall_ns();
        let who = Claimant { pid: 42, started_wall_ns: started, forked: false };
        let mut a = new_file(&dir, b"a");
        let got = claim(&dir, b"s.json", &mut a, &who, |_| false).unwrap();
        assert_eq!((got.name(), got.passed_over), (&b"s.json"[..], None));
        // A writer holds its file: the next process goes beside.
        let held = match dir::look(&dir, b"s.json") { Standing::Ours(f) => f, _ => panic!() };
        assert!(held.try_lock());
        let mut b = new_file(&dir, b"b");
        let got = claim(&dir, b"s.json", &mut b, &who, |_| false).unwrap();
        assert_eq!((got.name(), got.passed_over), (&b"s.json.42"[..], Some(PassedOver::Run)));
        drop(held);
        // Unheld but written since the claimant started: its run's, kept.
        let mut c = new_file(&dir, b"c");
        assert_eq!(claim(&dir, b"s.json", &mut c, &who, |_| false).unwrap().name(), b"s.json.42.2");
        // A later run takes the unheld, older file back.
        let later = Claimant { pid: 43, started_wall_ns: super::super::clock::wall_ns() + 3 * stale_margin_ns(), forked: false };
        let mut e = new_file(&dir, b"e");
        let got = claim(&dir, b"s.json", &mut e, &later, |_| false).unwrap();
        assert_eq!((got.name(), got.passed_over), (&b"s.json"[..], None));
        assert_eq!(std::fs::read(d.join("s.json")).unwrap(), b"e");
        // A forked child starts beside.
        let mut f = new_file(&dir, b"f");
        let got = claim(&dir, b"s.json", &mut f, &Claimant { forked: true, ..later }, |_| false).unwrap();
        assert_eq!((got.name(), got.passed_over), (&b"s.json.43"[..], Some(PassedOver::Forked)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_this_process_wrote_before_an_exec_is_never_taken() {
        let (d, dir) = tmpdir("image");
        let mut a = new_file(&dir, b"first image");
        claim(&dir, b"s.json", &mut a, &Claimant { pid: 7, started_wall_ns: 0, forked: false }, |_| false).unwrap();
        let later = Claimant { pid: 7, started_wall_ns: super::super::clock::wall_ns() + 3 * stale_margin_ns(), forked: false };
        let mut b = new_file(&dir, b"second image");
        let got = claim(&dir, b"s.json", &mut b, &later, |f| {
            let mut head = [0u8; 11];
            f.read_at(&mut head, 0) == 11 && &head == b"first image"
        })
        .unwrap();
        assert_eq!((got.name(), got.passed_over), (&b"s.json.7"[..], Some(PassedOver::EarlierImage)));
        assert_eq!(std::fs::read(d.join("s.json")).unwrap(), b"first image");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn what_others_plant_is_passed_over_untouched() {
        let (d, dir) = tmpdir("planted");
        let fifo = std::ffi::CString::new(d.join("s.json").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        std::fs::write(d.join("victim"), b"precious").unwrap();
        std::os::unix::fs::symlink(d.join("victim"), d.join("s.json.9")).unwrap();
        std::fs::hard_link(d.join("victim"), d.join("s.json.9.2")).unwrap();
        let who = Claimant { pid: 9, started_wall_ns: u64::MAX, forked: false };
        let mut a = new_file(&dir, b"ours");
        let got = claim(&dir, b"s.json", &mut a, &who, |_| false).unwrap();
        assert_eq!((got.name(), got.passed_over), (&b"s.json.9.3"[..], Some(PassedOver::Other(Refused::NotRegular))));
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"precious");
        let mut b = new_file(&dir, b"snap");
        assert_eq!(put_in_place(&dir, b"s.json.9", &mut b), Err(Refused::Symlink));
        assert_eq!(put_in_place(&dir, b"s.json.9.2", &mut b), Err(Refused::Linked));
        put_in_place(&dir, b"s.json.9.3", &mut b).unwrap();
        assert_eq!(std::fs::read(d.join("s.json.9.3")).unwrap(), b"snap");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn sixteen_claims_at_once_get_sixteen_names() {
        let (d, _dir) = tmpdir("race");
        let path = d.to_str().unwrap().to_owned();
        let started = super::super::clock::wall_ns();
        let names: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16u32)
                .map(|i| {
                    let path = path.clone();
                    s.spawn(move || {
                        let dir = Dir::open(path.as_bytes()).unwrap();
                        let mut f = new_file(&dir, format!("{i}").as_bytes());
                        let got = claim(&dir, b"s.json", &mut f, &Claimant { pid: 1000 + i, started_wall_ns: started, forked: false }, |_| false).unwrap();
                        String::from_utf8(got.name().to_vec()).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 16, "{names:?}");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 16);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
