//! Everything that turns records into words or files: the exit summary (`summary`), the
//! out-of-memory report (`oom`), the holders table (`holders`), the leak report (`leaks`), the
//! memory snapshot (`snapshot`, written by `pickle`), and byte and time units (`units`).
//! Reports read the state and the records; nothing below them imports them, and they are asked
//! for by the shims (the C API, the exit hook) and by the out-of-memory event's listener.

use crate::config::Config;

pub mod glibc;
pub mod holders;
pub mod children;
pub mod leaks;
pub mod oom;
pub mod pickle;
pub mod snapshot;
pub mod stats_file;
pub mod summary;
pub mod units;

/// Whether `at_exit` has anything to do: a report asked for, or an out-of-memory line held back.
/// With none, the exit hook does nothing at all (no stack of its own mapped: a program under
/// valgrind sees no stack switch, Note [A stack of our own]).
pub fn due_at_exit(config: &Config) -> bool {
    config.stats != crate::config::StatsOutput::Off || config.leaks || !config.snapshot_path().is_empty() || oom::holds_report()
}

/// At unload or exit: the summary, the leak report and the snapshot, each if asked for.
pub fn at_exit(config: &Config) {
    oom::settle_held();
    stats_file::at_exit(config);
    if config.leaks {
        leaks::report_at_exit();
    }
    // A process that made no large request and no CUDA call (a wrapper's helper) writes none.
    if !config.snapshot_path().is_empty() && summary::did_anything() {
        snapshot::at_exit(config.snapshot_path());
    }
}
