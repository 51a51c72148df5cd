//! Which file a process's JSON stats go to when several processes of one run share a path
//! without `%p` (Note [One file per process]). The decision is pure (`writes_beside`); the
//! looking is done through sys/files.rs.

use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

// Note [One file per process]
// PATH belongs to the run's first process: a process writes PATH unless it was forked from a
// process with us loaded, or a process of the same run (one still alive, or one that wrote PATH
// after this process started) that started before it has written PATH; then it writes PATH.PID
// beside it, says so once on stderr, and keeps to it. A process that finds PATH written by a
// younger one of the run (a child that wrote before its parent did) moves that file beside
// (PATH.THEIRPID), where the younger one, at its next write, goes on. So a DataLoader's or a
// Pool's workers, a spawn Pool's helper, a child that outlives its parent, never overwrite the
// first process's file, and a rerun of the program (whose old file names a process gone before
// it started) takes PATH back. The writer and its start are read from the file itself ("pid",
// "started_ns"). With `%p` in the path every process has its own file anyway.

/// The process that decided to write beside PATH (0: none): a forked child decides again.
static BESIDE_IN: AtomicU32 = AtomicU32::new(0);

/// When this process started (wall ns), as its JSON says ("started_ns").
pub fn started_ns() -> u64 {
    crate::sys::process::started_wall_ns()
}

/// Where a process's JSON stats go (Note [One file per process]).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Path,
    Beside,
    /// PATH is a younger process's of the run: its file moves beside, to PATH.PID, first.
    TakeOver(u32),
}

/// The rule for a process `own` that started at `own_started`, finding PATH written by `owner`
/// (its pid and start; start 0: unknown), alive or not, after `own` started or not.
pub fn decide(own: u32, own_started: u64, owner: Option<(u32, u64)>, owner_alive: bool, written_after_start: bool) -> Decision {
    match owner {
        Some((pid, started)) if pid != own && (owner_alive || written_after_start) => {
            if started > own_started {
                Decision::TakeOver(pid)
            } else {
                Decision::Beside
            }
        }
        _ => Decision::Path,
    }
}

/// The "pid" of a JSON stats file's first bytes (our files start `{"version":N,"pid":N`).
pub fn owner_of(head: &[u8]) -> Option<u32> {
    number_after(head, b"\"pid\":").and_then(|n| u32::try_from(n).ok())
}

/// The decimal number after `key` in `head`.
fn number_after(head: &[u8], key: &[u8]) -> Option<u64> {
    let at = head.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = head.get(at..)?;
    let digits = rest.get(..rest.iter().take_while(|b| b.is_ascii_digit()).count()).filter(|d| !d.is_empty())?;
    digits.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// The path this process writes its JSON stats to: `path` itself, or `path.%p` beside it
/// (into `out`); None when it does not fit.
pub fn stats_target<'a>(path: &'a [u8], out: &'a mut [u8; 4096]) -> Option<&'a [u8]> {
    let own = crate::sys::process::id();
    let has_pid = path.windows(2).any(|w| w == b"%p");
    let beside = !has_pid && (BESIDE_IN.load(Relaxed) == own || {
        let mut head = [0u8; 128];
        let seen = crate::sys::files::peek(path, &mut head);
        let head = seen.and_then(|(n, _)| head.get(..n)).unwrap_or(&[]);
        let owner = owner_of(head);
        let after = seen.is_some_and(|(_, mtime)| mtime >= started_ns());
        let parent = crate::state::parent_at_fork();
        let alive = owner.is_some_and(crate::sys::files::process_exists);
        let beside = parent.is_some()
            || match decide(own, started_ns(), owner.map(|pid| (pid, number_after(head, b"\"started_ns\":").unwrap_or(0))), alive, after) {
                Decision::Path => false,
                Decision::Beside => true,
                Decision::TakeOver(younger) => {
                    crate::sys::files::move_beside(path, younger);
                    false
                }
            };
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
    crate::sys::files::joined(path, b".%p", out)
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
    let newer = crate::sys::files::peek(path, &mut head).is_some_and(|(_, mtime)| mtime >= started_ns());
    if crate::state::parent_at_fork().is_none() && !newer {
        return Some(path);
    }
    let name = core::str::from_utf8(path).unwrap_or("(path)");
    crate::warn_line!("TENSORMALLOC_SNAPSHOT_AT_EXIT: {name} is another process's of this run; process {own} writes its snapshot beside it, to {name}.{own}");
    crate::sys::files::joined(path, b".%p", out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_first_process_keeps_path() {
        use Decision::*;
        assert_eq!(decide(10, 500, None, false, false), Path, "no file, or not ours to read");
        assert_eq!(decide(10, 500, Some((10, 500)), true, true), Path, "our own file");
        assert_eq!(decide(10, 500, Some((7, 100)), true, false), Beside, "an older process of the run, alive");
        assert_eq!(decide(10, 500, Some((7, 100)), false, true), Beside, "one gone since it wrote");
        assert_eq!(decide(10, 500, Some((7, 100)), false, false), Path, "an earlier run's file");
        assert_eq!(decide(10, 500, Some((12, 900)), true, true), TakeOver(12), "a child that wrote first steps aside");
        assert_eq!(decide(10, 500, Some((12, 0)), true, true), Beside, "a writer of unknown start keeps it");
    }

    #[test]
    fn the_owner_is_read_from_the_files_first_bytes() {
        assert_eq!(owner_of(br#"{"version":2,"pid":4242,"ppid":1"#), Some(4242));
        assert_eq!(owner_of(br#"{"version":2,"pid":"#), None, "cut before the digits");
        assert_eq!(owner_of(b"TMTRACE2"), None);
        assert_eq!(owner_of(br#"{"pid":99999999999}"#), None, "no wrap");
        assert_eq!(number_after(br#"{"version":2,"pid":7,"started_ns":1700000000123456789,"#, b"\"started_ns\":"), Some(1_700_000_000_123_456_789));
    }
}
