//! The report where TENSORMALLOC_STATS asks, at exit and from tm_print_stats: to stderr, or into
//! the stats file, where the counters live from the first event (record/ledger, Note [Numbers
//! that survive]). The JSON report is kept in that file, rewritten by the background pass while
//! the numbers move; at a normal exit the JSON replaces the file (or, when no event made one,
//! takes a name of its own: Note [One file per process]); under TENSORMALLOC_STATS=1 the file is
//! removed once the report is printed. One writer at a time; nothing here allocates.

use super::summary::{did_anything, write_json, Ending, Snapshot};
use crate::config::{Config, StatsOutput};
use crate::record::ledger;
use crate::sys::stderr::StackWriter;

/// Room for the report: the counters, the phase table and up to MAX_ROWS holder rows.
const REPORT_BYTES: usize = ledger::DETAIL_BYTES;

/// Writes the report now (tm_print_stats): to stderr, or into this process's stats file (made
/// now if no event made it yet), where `tensormalloc report PATH` reads it while the process
/// runs; whatever `stats` is set to.
pub fn write_report(config: &Config) {
    if config.stats == StatsOutput::Json {
        ledger::ensure_claimed();
        refresh(Ending::Running);
        return;
    }
    let snap = Snapshot::take();
    let mut w = StackWriter::<REPORT_BYTES>::new();
    let _ = super::summary::write_text(&mut w, &snap);
    w.flush_to(2);
}

/// At exit, the report asked for, from a process that made a large request or a CUDA call: a
/// wrapper's helper processes (a pyenv shim starts about 30) stay silent and write no file.
pub fn at_exit(config: &Config) {
    if config.stats != StatsOutput::Off {
        ledger::begin_exit();
    }
    match config.stats {
        StatsOutput::Off => {}
        StatsOutput::Stderr => {
            let printed = did_anything().then(|| {
                let snap = Snapshot::take();
                let mut w = StackWriter::<REPORT_BYTES>::new();
                let _ = super::summary::write_text(&mut w, &snap);
                w
            });
            // Printed, then marked and removed with no signal between (a Pool's SIGTERM at
            // this instant would leave a printed file for the parent to count a second time).
            // A wait for room (a full pipe nobody reads) lets the program's signals in: a
            // SIGTERM then still ends the process, as it ends one blocked in its own write.
            crate::sys::thread::with_signals_held(|open| {
                if let Some(w) = printed {
                    let _ = crate::sys::files::write_all_waiting_open(2, w.as_bytes(), open);
                }
                ledger::mark_exited();
                remove_own_file();
            });
            crate::report::children::report_at_exit();
        }
        StatsOutput::Json => {
            if did_anything() || ledger::claimed() {
                json_at_exit(config.stats_path());
            }
        }
    }
}


/// At load: where the counters go under TENSORMALLOC_STATS (Note [Numbers that survive]), and
/// the background pass that keeps their detail current.
pub fn start(config: &'static Config) {
    match config.stats {
        StatsOutput::Off => return,
        StatsOutput::Json => ledger::start(ledger::Where::Path(config.stats_path())),
        StatsOutput::Stderr => ledger::start(ledger::Where::RuntimeDir),
    }
    crate::state::keep_current(keep_current);
}

/// Rewrites the JSON kept in the counters file; false when there is none (or the exit hook
/// wrote its last one: nothing is rewritten after it).
pub(super) fn refresh(ending: Ending) -> bool {
    let _one = WRITING.lock();
    refresh_held(ending)
}

/// `refresh` with WRITING held by the caller.
fn refresh_held(ending: Ending) -> bool {
    if ledger::exited() {
        return false;
    }
    let snap = Snapshot::take();
    ledger::write_detail(|d| write_json(d, &snap, ending))
}

/// One writer of the JSON at a time (the background pass, tm_print_stats, the exit hook).
static WRITING: crate::sys::lock::Lock<()> = crate::sys::lock::Lock::new(());

/// In a forked child: a writer the parent's background thread was in at the fork is not in
/// this process; its lock would stay held for good.
pub fn after_fork_in_child() {
    // SAFETY: the child has one thread, which holds no lock of ours here.
    unsafe { WRITING.free_in_child() };
}

/// The JSON at a normal exit: it replaces the counters file (the JSON is rendered into the file
/// first, which then says the exit hook ran), or, when no event made one, takes a name of its own
/// (Note [One file per process]).
pub(super) fn json_at_exit(path: &[u8]) {
    use crate::sys::dir::{Dir, Unnamed};
    use crate::sys::files;
    // One hold of WRITING from the last JSON to the file that replaces the counters: the
    // background pass cannot rewrite the JSON in between.
    let one = WRITING.lock();
    let written = if refresh_held(Ending::Exit) {
        ledger::mark_exited();
        match (ledger::own_file(), ledger::detail()) {
            (Some(Err(lost)), _) => Err(files::Refused::Os(lost)),
            (Some(Ok((dir_fd, name, fd))), Some(json)) => {
                // SAFETY: the counters' directory, open for the process's life; borrowed here.
                let dir = core::mem::ManuallyDrop::new(unsafe { Dir::from_raw(dir_fd) });
                Unnamed::create(&dir, name).and_then(|mut file| {
                    files::write_all(file.fd(), json)?;
                    if crate::sys::dir::names(&dir, name, fd) {
                        file.replace(name)
                    } else {
                        // Our file was moved or removed meanwhile: the JSON takes a name anew.
                        claim_for_json(&dir, path, &mut file)
                    }
                })
            }
            _ => Err(files::Refused::Os(libc::ENOSPC)),
        }
    } else {
        drop(one);
        let snap = Snapshot::take();
        let mut w = StackWriter::<REPORT_BYTES>::new();
        let _ = write_json(&mut w, &snap, Ending::Exit);
        let (dir_part, _) = files::split(path);
        let mut dir_path = [0u8; files::PATH_MAX_BYTES + 1];
        files::expand_path(dir_part, crate::sys::process::id(), &mut dir_path)
            .ok_or(files::Refused::Os(libc::ENAMETOOLONG))
            .and_then(|n| Dir::open(dir_path.get(..n).unwrap_or(&[])))
            .and_then(|dir| {
                let mut file = Unnamed::create(&dir, files::split(path).1)?;
                files::write_all(file.fd(), w.as_bytes())?;
                claim_for_json(&dir, path, &mut file)
            })
    };
    // Said once: when the file could not be made at the first event, that line said it.
    if let (Err(e), false) = (written, ledger::file_refused()) {
        let mut text = [0u8; 128];
        // The name as the file would have it (%p expanded), as the trace's line says it.
        let mut named = [0u8; files::PATH_MAX_BYTES + 1];
        let shown = files::expand_path(path, crate::sys::process::id(), &mut named).and_then(|n| named.get(..n)).unwrap_or(path);
        crate::warn_line!("cannot write the stats to {} ({})", core::str::from_utf8(shown).unwrap_or("(path)"), e.text(&mut text));
    }
}

/// Names the JSON file as a process of a run names its stats (Note [One file per process]).
fn claim_for_json(dir: &crate::sys::dir::Dir, path: &[u8], file: &mut crate::sys::dir::Unnamed) -> Result<(), crate::sys::files::Refused> {
    use crate::sys::claim;
    let parent = crate::state::parent_at_fork();
    let claimed = claim::claim(dir, crate::sys::files::split(path).1, file, &claim::Claimant::this(parent.is_some()), |_| false)?;
    if let Some(why) = claimed.passed_over {
        claim::say(claim::Output::Stats, path, claim::Shown::of(path, claimed.name()).get(), why, parent.unwrap_or(0));
    }
    Ok(())
}

/// Removes this process's counters file (TENSORMALLOC_STATS=1, once its report is printed).
pub(super) fn remove_own_file() {
    use crate::sys::dir::{self, Dir, Standing};
    let Some(Ok((dir_fd, name, fd))) = ledger::own_file() else { return };
    // SAFETY: as in json_at_exit.
    let dir = core::mem::ManuallyDrop::new(unsafe { Dir::from_raw(dir_fd) });
    if let Standing::Ours(found) = dir::look(&dir, name) {
        if dir::names(&dir, name, fd) {
            dir::remove(&dir, name, &found);
        }
    }
}

/// The sum of the counts that change when the process does anything: the detail is rewritten
/// only when it moved.
static WRITTEN_ACTIVITY: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(u64::MAX);

/// From the background thread, about every second: the JSON kept in the counters file made
/// current (Note [Numbers that survive]: the counts are current at every event; this brings the
/// rest, cached bytes, phases, holders, to within a second).
pub fn keep_current() {
    if !ledger::claimed() {
        return;
    }
    let s = Snapshot::take();
    let activity = s.host_requests.wrapping_add(s.host_frees).wrapping_add(s.cuda_requests).wrapping_add(s.pinned_requests).wrapping_add(s.cuda_segments_released);
    if WRITTEN_ACTIVITY.swap(activity, core::sync::atomic::Ordering::Relaxed) != activity {
        refresh(Ending::Running);
    }
}
