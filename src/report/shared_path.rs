//! Which file a process's JSON stats go to when several processes of one run share a path
//! without `%p` (Note [One file per process]). The decision is pure (`writes_beside`); the
//! looking is done through sys/files.rs.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

// Note [One file per process]
// A process writes PATH unless it was forked from a process with us loaded, or another process
// of the same run has written PATH (one still alive, or one that wrote it after this process
// started); then it writes PATH.PID beside it, says so once on stderr, and keeps to it. So a DataLoader's or a Pool's workers, a spawn Pool's helper,
// a child that outlives its parent, never overwrite the first process's file, and a rerun of the
// program (whose old file names a process gone before it started) takes PATH back. The owner is
// read from the file itself (its "pid"). With `%p` in the path every process has its own file
// anyway. Two processes that write first at the same moment both write PATH once; the next
// write (within a second) sends the one that lost beside it.

/// When this process started (wall ns; a forked child: its fork), for "written after it started".
static STARTED_WALL_NS: AtomicU64 = AtomicU64::new(0);
/// The process that decided to write beside PATH (0: none): a forked child decides again.
static BESIDE_IN: AtomicU32 = AtomicU32::new(0);

/// At load, and in a forked child: this process starts now.
pub fn note_start(wall_ns: u64) {
    STARTED_WALL_NS.store(wall_ns, Relaxed);
}

/// Whether a process `own` writes beside PATH, whose file names `owner` as its writer.
pub fn writes_beside(own: u32, owner: Option<u32>, owner_alive: bool, written_after_start: bool) -> bool {
    match owner {
        Some(pid) if pid != own => owner_alive || written_after_start,
        _ => false,
    }
}

/// The "pid" of a JSON stats file's first bytes (our files start `{"version":N,"pid":N`).
pub fn owner_of(head: &[u8]) -> Option<u32> {
    let key = b"\"pid\":";
    let at = head.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = head.get(at..)?;
    let digits = rest.get(..rest.iter().take_while(|b| b.is_ascii_digit()).count()).filter(|d| !d.is_empty())?;
    digits.iter().try_fold(0u32, |n, &d| n.checked_mul(10)?.checked_add(u32::from(d - b'0')))
}

/// The path this process writes its JSON stats to: `path` itself, or `path.%p` beside it
/// (into `out`); None when it does not fit.
pub fn stats_target<'a>(path: &'a [u8], out: &'a mut [u8; 4096]) -> Option<&'a [u8]> {
    let own = crate::sys::process::id();
    let has_pid = path.windows(2).any(|w| w == b"%p");
    let beside = !has_pid && (BESIDE_IN.load(Relaxed) == own || {
        let mut head = [0u8; 64];
        let seen = crate::sys::files::peek(path, &mut head);
        let owner = seen.and_then(|(n, _)| owner_of(head.get(..n).unwrap_or(&[])));
        let after = seen.is_some_and(|(_, mtime)| mtime >= STARTED_WALL_NS.load(Relaxed));
        let parent = crate::state::parent_at_fork();
        let beside = parent.is_some() || writes_beside(own, owner, owner.is_some_and(crate::sys::files::process_exists), after);
        if beside && BESIDE_IN.swap(own, Relaxed) != own {
            let name = core::str::from_utf8(path).unwrap_or("(path)");
            match parent {
                Some(p) => crate::warn_line!("process {own}, forked from {p}, writes its stats beside {name}, to {name}.{own}"),
                None => crate::warn_line!("{name} is written by process {} of this run; process {own} writes its stats beside it, to {name}.{own}", owner.unwrap_or(0)),
            }
        }
        beside
    });
    if !beside {
        return Some(path);
    }
    let len = path.len() + 3;
    let dst = out.get_mut(..len)?;
    for (slot, &b) in dst.iter_mut().zip(path.iter().chain(b".%p")) {
        *slot = b;
    }
    Some(&*dst)
}

/// The path of this process's snapshot at exit (Note [One file per process]): its files carry no
/// writer's pid, so the rule reads the time alone: PATH, unless this process was forked from one
/// with us loaded, or PATH was written after this process started by another one of the run
/// (a sibling or a parent that ended first); then PATH.PID.
pub fn snapshot_target<'a>(path: &'a [u8], out: &'a mut [u8; 4096]) -> Option<&'a [u8]> {
    let own = crate::sys::process::id();
    if path.windows(2).any(|w| w == b"%p") {
        return Some(path);
    }
    let mut head = [0u8; 1];
    let newer = crate::sys::files::peek(path, &mut head).is_some_and(|(_, mtime)| mtime >= STARTED_WALL_NS.load(Relaxed));
    if crate::state::parent_at_fork().is_none() && !newer {
        return Some(path);
    }
    let name = core::str::from_utf8(path).unwrap_or("(path)");
    crate::warn_line!("TENSORMALLOC_SNAPSHOT_AT_EXIT: {name} is another process's of this run; process {own} writes its snapshot beside it, to {name}.{own}");
    let len = path.len() + 3;
    let dst = out.get_mut(..len)?;
    for (slot, &b) in dst.iter_mut().zip(path.iter().chain(b".%p")) {
        *slot = b;
    }
    Some(&*dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_live_process_or_a_newer_file_sends_us_beside() {
        assert!(!writes_beside(10, None, false, false), "no file, or not ours to read: PATH");
        assert!(!writes_beside(10, Some(10), true, true), "our own file");
        assert!(writes_beside(10, Some(7), true, false), "the parent, alive");
        assert!(writes_beside(10, Some(7), false, true), "a process of this run, gone since it wrote");
        assert!(!writes_beside(10, Some(7), false, false), "an earlier run's file");
    }

    #[test]
    fn the_owner_is_read_from_the_files_first_bytes() {
        assert_eq!(owner_of(br#"{"version":2,"pid":4242,"ppid":1"#), Some(4242));
        assert_eq!(owner_of(br#"{"version":2,"pid":"#), None, "cut before the digits");
        assert_eq!(owner_of(b"TMTRACE2"), None);
        assert_eq!(owner_of(br#"{"pid":99999999999}"#), None, "no wrap");
    }
}
