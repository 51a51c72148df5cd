//! At the exit of a process run with TENSORMALLOC_STATS=1: the numbers of the processes it
//! started (children, grandchildren: a forkserver's workers) and of its own images before an
//! exec, that ended without printing their report (killed, SIGTERM'd Pool workers, os._exit,
//! exec), read from their counters files in the user's runtime directory (record/ledger) and
//! summed in one line; those files are then removed. A descendant still running is counted in a
//! second line that says where its file is. No allocation: names come from getdents64 into a
//! stack buffer, files are read with pread.

use crate::record::ledger;
use crate::report::units::Bytes;
use crate::sys::dir::{self, Standing};
use crate::sys::files;

/// "1 process", "3 processes".
struct Processes(u64);

impl core::fmt::Display for Processes {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} {}", self.0, if self.0 == 1 { "process" } else { "processes" })
    }
}

/// What the ended descendants did, together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub processes: u64,
    pub requests: u64,
    pub hits: u64,
    pub frees: u64,
    pub live_bytes: u64,
    pub largest_peak_bytes: u64,
    pub device_requests: u64,
    pub reserved_bytes: u64,
}

impl Totals {
    pub fn add(&mut self, r: &ledger::Read) {
        self.processes += 1;
        self.requests += r.requests;
        self.hits += r.hits;
        self.frees += r.frees;
        self.live_bytes += r.live_bytes;
        self.largest_peak_bytes = self.largest_peak_bytes.max(r.peak_live_bytes);
        self.device_requests += r.device_requests;
        self.reserved_bytes += r.reserved_bytes;
    }
}

/// Whether the file `r` is one this process collects: a descendant's (it lists this process
/// among its ancestors, by pid and start), or this process's own under an earlier image.
pub fn is_ours(r: &ledger::Read, pid: u32, start_ticks: u64, image_started_wall_ns: u64) -> bool {
    let descendant = r.ancestors.iter().take(r.ancestor_count).any(|&(p, s)| p == pid && s == start_ticks);
    let earlier_image = r.pid == pid && r.start_ticks == start_ticks && r.image_started_wall_ns != image_started_wall_ns;
    start_ticks != 0 && (descendant || earlier_image)
}

/// The summary line's text (without the "tensormalloc: " prefix).
pub fn write_line<W: core::fmt::Write>(w: &mut W, t: &Totals, own: u32) -> core::fmt::Result {
    let percent = if t.requests == 0 { 0.0 } else { t.hits as f64 * 100.0 / t.requests as f64 };
    write!(
        w,
        "{} started by process {own} (or its image before an exec) ended without printing their report (killed, os._exit or exec); together: requests {}  hits {} ({percent:.1}%)  frees {}  live at their end {}  largest peak {}",
        Processes(t.processes),
        t.requests,
        t.hits,
        t.frees,
        Bytes(t.live_bytes),
        Bytes(t.largest_peak_bytes)
    )?;
    if t.device_requests > 0 {
        write!(w, "  cuda requests {}, reserved at their end {}", t.device_requests, Bytes(t.reserved_bytes))?;
    }
    Ok(())
}

/// Reads, sums, prints and removes the files of ended descendants (see the top).
pub fn report_at_exit() {
    use crate::sys::process;
    let (own, start, image) = (process::id(), process::start_ticks(), process::started_wall_ns());
    let mut path = [0u8; files::PATH_MAX_BYTES + 1];
    let Ok((dir, len)) = crate::sys::claim::runtime_dir(&mut path, false) else { return };
    let mut ended = Totals::default();
    let mut running = 0u64;
    dir.for_each_name(|name| {
        if !name.ends_with(b".stats") {
            return;
        }
        let Standing::Ours(file) = dir::look(&dir, name) else { return };
        let mut head = [0u8; ledger::DETAIL_AT];
        if file.read_at(&mut head, 0) < head.len() {
            return;
        }
        let Some(r) = ledger::read(&head) else { return };
        if !is_ours(&r, own, start, image) {
            return;
        }
        // A live writer holds its file's lock (Note [One file per process]).
        if !file.try_lock() {
            running += 1;
            return;
        }
        // Another collector may have taken it between our look and our lock.
        if !file.linked() {
            return;
        }
        // One that printed its own report is not counted again (its exit hook marks the file).
        if !r.exited {
            ended.add(&r);
        }
        dir::remove(&dir, name, &file);
    });
    if ended.processes > 0 {
        let mut w = crate::sys::stderr::StackWriter::<768>::new();
        let _ = core::fmt::Write::write_str(&mut w, "tensormalloc: ");
        let _ = write_line(&mut w, &ended, own);
        let _ = core::fmt::Write::write_str(&mut w, "\n");
        w.flush_to(2);
    }
    if running > 0 {
        let shown = core::str::from_utf8(path.get(..len).unwrap_or(&[])).unwrap_or("(runtime directory)");
        crate::warn_line!("{} started by process {own} still running; their numbers are in {shown} (tensormalloc report {shown}/PID.stats)", Processes(running));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_and_earlier_images_are_ours_and_nothing_else() {
        let mut r = ledger::Read { pid: 50, start_ticks: 900, image_started_wall_ns: 5, ancestor_count: 2, ..Default::default() };
        r.ancestors[0] = (40, 800);
        r.ancestors[1] = (30, 700);
        assert!(is_ours(&r, 30, 700, 1), "a grandchild (a forkserver's worker)");
        assert!(!is_ours(&r, 30, 701, 1), "a reused pid is another process");
        assert!(is_ours(&r, 50, 900, 6), "this process before its exec");
        assert!(!is_ours(&r, 50, 900, 5), "this very image");
        assert!(!is_ours(&r, 20, 600, 1), "not in its line");
    }

    #[test]
    fn the_line_sums_what_adds_up() {
        let mut t = Totals::default();
        let r = |requests, peak| ledger::Read { requests, hits: requests - 1, frees: requests, peak_live_bytes: peak, ..Default::default() };
        t.add(&r(50, 8 << 20));
        t.add(&r(30, 16 << 20));
        let mut w = crate::sys::stderr::StackWriter::<768>::new();
        write_line(&mut w, &t, 7).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.starts_with("2 processes started by process 7"), "{text}");
        assert!(text.contains("requests 80  hits 78 (97.5%)  frees 80") && text.contains("largest peak 16.0 MiB"), "{text}");
        assert!(!text.contains("cuda"), "{text}");
    }
}
