//! What the user sees: the stats snapshot behind `tm_get_stats`, and the report it makes, as text
//! or JSON (report/stats_file.rs says where it goes). Formatting happens in a fixed stack buffer (or the
//! mapped counters file's detail area) and leaves with write(2): no allocation, no lock but the
//! cache's own brief one. The stats file the JSON goes to is report/stats_file.rs's.

use crate::record::stats::PhaseTimer;
use crate::report::units::{Bytes, Count, Nanos};
use crate::state::{DEVICE, HOST};
use core::fmt::{self, Write};

/// Bumped when fields are appended to `tm_stats_t`.
pub const STATS_VERSION: u32 = 3;

/// `tm_stats_t` in include/tensormalloc.h: the same fields in the same order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub size: usize,
    pub version: u32,
    pub enabled: u32,
    pub threshold_bytes: u64,
    pub host_requests: u64,
    pub host_hits: u64,
    pub host_misses: u64,
    pub host_grows: u64,
    pub host_hit_bytes: u64,
    pub host_frees: u64,
    pub host_live_bytes: u64,
    pub host_peak_live_bytes: u64,
    pub host_cached_bytes: u64,
    pub host_peak_cached_bytes: u64,
    pub host_cached_blocks: u64,
    pub host_released_blocks: u64,
    pub host_released_bytes: u64,
    pub host_unmapped_blocks: u64,
    pub host_unmapped_bytes: u64,
    pub host_map_failures: u64,
    pub cuda_requests: u64,
    pub cuda_hits: u64,
    pub cuda_segments_mapped: u64,
    pub cuda_segments_released: u64,
    pub cuda_oom_retries: u64,
    pub cuda_oom_failures: u64,
    pub cuda_reserved_bytes: u64,
    pub cuda_peak_reserved_bytes: u64,
    pub cuda_live_bytes: u64,
    pub cuda_peak_live_bytes: u64,
    pub pinned_requests: u64,
    pub pinned_hits: u64,
    pub pinned_cached_bytes: u64,
    pub pinned_peak_cached_bytes: u64,
    // Version 2 (Note [What RSS shows]).
    pub host_cached_resident_bytes: u64,
    pub host_cached_lazyfree_bytes: u64,
    // Version 3: the rest of the JSON's host figures.
    pub host_handed_out_bytes: u64,
    pub host_deferred_unmap_bytes: u64,
    pub host_bound_blocks: u64,
    pub host_bound_bytes: u64,
    pub host_calloc_zeroed_by_discard: u64,
    pub host_reset_blocks: u64,
    pub host_unresettable_blocks: u64,
    pub host_retries_after_trim: u64,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        // Blocks freed into threads' slots are the cache's in every figure below.
        HOST.settle_slots();
        let s = &HOST.stats;
        let (blocks, bytes) = HOST.cached();
        let mut snap = Snapshot {
            size: core::mem::size_of::<Snapshot>(),
            version: STATS_VERSION,
            enabled: u32::from(crate::state::HOST.is_enabled()),
            threshold_bytes: HOST.threshold_bytes() as u64,
            host_requests: s.requests.get(),
            host_hits: s.hits.get(),
            host_misses: s.misses.get(),
            host_grows: s.grows.get(),
            host_hit_bytes: s.hit_bytes.get(),
            host_frees: s.frees.get(),
            host_live_bytes: s.live.current(),
            host_peak_live_bytes: s.live.peak(),
            host_cached_bytes: bytes as u64,
            host_peak_cached_bytes: s.cached.peak(),
            host_cached_blocks: blocks as u64,
            host_released_blocks: s.released_blocks.get(),
            host_released_bytes: s.released_bytes.get(),
            host_unmapped_blocks: s.unmapped_blocks.get(),
            host_unmapped_bytes: s.unmapped_bytes.get(),
            host_map_failures: s.map_failures.get(),
            host_handed_out_bytes: s.live.total(),
            host_deferred_unmap_bytes: s.deferred.current(),
            host_calloc_zeroed_by_discard: s.zeroed_by_discard.get(),
            host_reset_blocks: s.resets.get(),
            host_unresettable_blocks: s.unresettable.get(),
            host_retries_after_trim: s.retries_after_trim.get(),
            ..Snapshot::default()
        };
        DEVICE.for_each_pool(|_, pool| {
            let p = &pool.stats;
            snap.cuda_requests += p.requests;
            snap.cuda_hits += p.hits;
            snap.cuda_segments_mapped += p.segments_mapped;
            snap.cuda_segments_released += p.segments_released;
            snap.cuda_oom_retries += p.oom_retries;
            snap.cuda_oom_failures += p.oom_failures;
            snap.cuda_reserved_bytes += p.reserved_bytes;
            snap.cuda_peak_reserved_bytes += p.peak_reserved_bytes;
            snap.cuda_live_bytes += p.live_bytes;
            snap.cuda_peak_live_bytes += p.peak_live_bytes;
        });
        (snap.pinned_requests, snap.pinned_hits, snap.pinned_cached_bytes, snap.pinned_peak_cached_bytes) = DEVICE.pinned_figures();
        let (resident, lazy) = HOST.cached_resident();
        (snap.host_cached_resident_bytes, snap.host_cached_lazyfree_bytes) = (resident as u64, lazy as u64);
        let (bound_blocks, bound_bytes) = HOST.bounds();
        (snap.host_bound_blocks, snap.host_bound_bytes) = (bound_blocks as u64, bound_bytes as u64);
        snap
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Under the phase table: what the words above it mean (they are the JSON's names).
const WORDS: &str = "grows: misses served by gathering cached pages (no fault); lazyfree: released lazily (MADV_FREE), in RSS until the kernel needs it; released: pages back to the kernel, device memory to the driver; bound: what the cache may hold now; unresettable: freed blocks not reusable";

/// One row of the phase table: (indent, name, timer).
type PhaseRow<'a> = (usize, &'a str, &'a PhaseTimer);
const DEVICE_ROWS: usize = 5;

/// The host rows, then the device rows (`DEVICE_ROWS` of them, left out of the text report of a
/// process that made no CUDA call).
fn phase_rows() -> [PhaseRow<'static>; 16] {
    let p = &HOST.stats.phases;
    let d = &DEVICE.stats.phases;
    [
        (0, "large alloc", &p.alloc),
        (1, "cache hit", &p.alloc_hit),
        (1, "zero (calloc hit)", &p.alloc_zero),
        (1, "grow (gather cached pages)", &p.alloc_grow),
        (1, "fresh mmap (miss)", &p.alloc_map),
        (0, "large free", &p.free),
        (1, "munmap (evict, refuse)", &p.free_unmap),
        (0, "deferred munmap (background)", &p.deferred_unmap),
        (0, "large realloc", &p.realloc),
        (0, "idle release (madvise)", &p.release),
        (0, "idle unmap (munmap)", &p.expire),
        (0, "cudaMalloc / cuMemAlloc", &d.malloc),
        (1, "driver cuMemAlloc (segment)", &d.malloc_runtime),
        (0, "cudaFree / cuMemFree", &d.free),
        (1, "synchronize (free, reuse)", &d.sync),
        (1, "driver cuMemFree (release)", &d.free_runtime),
    ]
}

pub fn write_text<W: Write>(w: &mut W, s: &Snapshot) -> fmt::Result {
    match crate::state::parent_at_fork() {
        Some(parent) => writeln!(w, "tensormalloc {} report (pid {}, forked from {}: its numbers from the fork on)", env!("CARGO_PKG_VERSION"), std::process::id(), parent)?,
        None => writeln!(w, "tensormalloc {} report (pid {})", env!("CARGO_PKG_VERSION"), std::process::id())?,
    }
    writeln!(
        w,
        " host cache: threshold {}, {}",
        Bytes(s.threshold_bytes),
        if s.enabled != 0 { "enabled" } else { "disabled" }
    )?;
    // The words are the JSON's names (Note [One vocabulary] in config.rs), explained under the
    // phase table.
    writeln!(
        w,
        "  requests {}  hits {} ({:.1}%)  grows {}  misses {}  hit bytes {}  frees {}",
        s.host_requests,
        s.host_hits,
        percent(s.host_hits, s.host_requests),
        s.host_grows,
        s.host_misses,
        Bytes(s.host_hit_bytes),
        s.host_frees
    )?;
    writeln!(
        w,
        "  live {} (peak {})  cached {} in {} (peak {}): resident {}, lazyfree {}",
        Bytes(s.host_live_bytes),
        Bytes(s.host_peak_live_bytes),
        Bytes(s.host_cached_bytes),
        Count(s.host_cached_blocks, "block"),
        Bytes(s.host_peak_cached_bytes),
        Bytes(s.host_cached_resident_bytes),
        Bytes(s.host_cached_lazyfree_bytes)
    )?;
    writeln!(
        w,
        "  released {}, {}  unmapped {}, {}  deferred unmap {}  map failures {}",
        Count(s.host_released_blocks, "block"),
        Bytes(s.host_released_bytes),
        Count(s.host_unmapped_blocks, "block"),
        Bytes(s.host_unmapped_bytes),
        Bytes(s.host_deferred_unmap_bytes),
        s.host_map_failures
    )?;
    writeln!(
        w,
        "  bound {}, {}  calloc zeroed by discard {}  unresettable blocks {}  reset blocks {}  retries after trim {}",
        Count(s.host_bound_blocks, "block"),
        Bytes(s.host_bound_bytes),
        s.host_calloc_zeroed_by_discard,
        s.host_unresettable_blocks,
        s.host_reset_blocks,
        s.host_retries_after_trim
    )?;
    DEVICE.for_each_pool(|device, pool| {
        let p = &pool.stats;
        // Note [Expandable segments]: there, what is mapped and released is 2 MiB chunks.
        let unit = if pool.expandable() { " (expandable: 2 MiB chunks)" } else { "" };
        let _ = writeln!(
            w,
            " cuda device {device}: requests {}  hits {} ({:.1}%)  segments mapped {} released {}{unit}  syncs {}",
            p.requests,
            p.hits,
            percent(p.hits, p.requests),
            p.segments_mapped,
            p.segments_released,
            p.syncs
        );
        let _ = writeln!(
            w,
            "  live {} (peak {})  reserved {} (peak {})  oom retries {}  oom failures {}  resets {}  ipc exports {}",
            Bytes(p.live_bytes),
            Bytes(p.peak_live_bytes),
            Bytes(p.reserved_bytes),
            Bytes(p.peak_reserved_bytes),
            p.oom_retries,
            p.oom_failures,
            p.resets,
            p.ipc_exports,
        );
        let _ = writeln!(
            w,
            "  released: idle {} in {}  pressure {} in {}  neighbour {} in {}",
            Bytes(p.idle_released_bytes),
            Count(p.idle_released_segments, "segment"),
            Bytes(p.pressure_released_bytes),
            Count(p.pressure_released_segments, "segment"),
            Bytes(p.neighbour_released_bytes),
            Count(p.neighbour_released_segments, "segment")
        );
    });
    let passed_through = DEVICE.stats.passthrough.get();
    if passed_through > 0 {
        writeln!(w, " cuda requests passed through unpooled: {passed_through} (pool off, another context's request, or its tables full)")?;
    }
    if s.pinned_requests > 0 {
        writeln!(
            w,
            " pinned host memory: requests {}  hits {} ({:.1}%)  cached {} (peak {})",
            s.pinned_requests,
            s.pinned_hits,
            percent(s.pinned_hits, s.pinned_requests),
            Bytes(s.pinned_cached_bytes),
            Bytes(s.pinned_peak_cached_bytes)
        )?;
    }
    let rows = phase_rows();
    let total: u64 = rows.iter().filter(|r| r.0 == 0).map(|r| r.2.total_ns.get()).sum();
    let cuda_used = DEVICE.stats.phases.malloc.calls.get() + DEVICE.stats.phases.free.calls.get() > 0;
    let shown = if cuda_used { rows.len() } else { rows.len() - DEVICE_ROWS };
    writeln!(w, " {:<30} {:>10} {:>10} {:>7} {:>10}", "Section", "ncalls", "time", "%tot", "avg")?;
    let legend = "%tot: share of the time spent inside tensormalloc's large-block and CUDA calls (the unindented rows sum to 100%), not of the run";
    for &(indent, name, t) in rows.iter().take(shown) {
        let calls = t.calls.get();
        let ns = t.total_ns.get();
        let avg = ns.checked_div(calls).unwrap_or(0);
        let pad = 30usize.saturating_sub(indent * 2);
        writeln!(
            w,
            " {:indent$}{:<pad$} {:>10} {:>10} {:>6.1}% {:>10}",
            "",
            name,
            calls,
            crate::report::units::pad(Nanos(ns)),
            percent(ns, total),
            crate::report::units::pad(Nanos(avg)),
            indent = indent * 2,
            pad = pad
        )?;
    }
    writeln!(w, " {legend}")?;
    writeln!(w, " {WORDS}")?;
    crate::report::holders::write_text(w, &crate::report::holders::Table::gather())
}

/// Whether a JSON report is the last one of its image (its exit hook ran) or one of the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Running,
    Exit,
}

pub fn write_json<W: Write>(w: &mut W, s: &Snapshot, ending: Ending) -> fmt::Result {
    let mut name = [0u8; 32];
    let command = crate::sys::process::command_name(&mut name);
    write!(
        w,
        "{{\"version\":{},\"pid\":{},\"started_ns\":{},\"ppid\":{},\"command\":",
        s.version,
        std::process::id(),
        crate::sys::process::started_wall_ns(),
        crate::sys::process::parent_id()
    )?;
    write!(w, "\"{}\"", crate::report::units::JsonText(command))?;
    match crate::state::parent_at_fork() {
        Some(parent) => write!(w, ",\"forked_from\":{parent}")?,
        None => w.write_str(",\"forked_from\":null")?,
    }
    let (complete, ended) = match ending {
        Ending::Exit => (true, "exit"),
        Ending::Running => (false, "running"),
    };
    write!(w, ",\"process_start_ticks\":{},\"complete\":{complete},\"ended\":\"{ended}\"", crate::sys::process::start_ticks())?;
    write!(w, ",\"enabled\":{},", s.enabled != 0)?;
    write!(
        w,
        "\"host\":{{\"threshold_bytes\":{},\"requests\":{},\"hits\":{},\"grows\":{},\"misses\":{},\"hit_bytes\":{},\"frees\":{},",
        s.threshold_bytes, s.host_requests, s.host_hits, s.host_grows, s.host_misses, s.host_hit_bytes, s.host_frees
    )?;
    write!(
        w,
        "\"live_bytes\":{},\"peak_live_bytes\":{},\"handed_out_bytes\":{},\"cached_bytes\":{},\"peak_cached_bytes\":{},\"cached_blocks\":{},\"cached_resident_bytes\":{},\"cached_lazyfree_bytes\":{},",
        s.host_live_bytes,
        s.host_peak_live_bytes,
        s.host_handed_out_bytes,
        s.host_cached_bytes,
        s.host_peak_cached_bytes,
        s.host_cached_blocks,
        s.host_cached_resident_bytes,
        s.host_cached_lazyfree_bytes
    )?;
    write!(
        w,
        "\"released_blocks\":{},\"released_bytes\":{},\"unmapped_blocks\":{},\"unmapped_bytes\":{},\"deferred_unmap_bytes\":{},\"map_failures\":{},",
        s.host_released_blocks,
        s.host_released_bytes,
        s.host_unmapped_blocks,
        s.host_unmapped_bytes,
        s.host_deferred_unmap_bytes,
        s.host_map_failures
    )?;
    write!(
        w,
        "\"bound_blocks\":{},\"bound_bytes\":{},\"calloc_zeroed_by_discard\":{},\"unresettable_blocks\":{},\"reset_blocks\":{},\"retries_after_trim\":{}}},",
        s.host_bound_blocks,
        s.host_bound_bytes,
        s.host_calloc_zeroed_by_discard,
        s.host_unresettable_blocks,
        s.host_reset_blocks,
        s.host_retries_after_trim
    )?;
    w.write_str("\"cuda\":[")?;
    let mut first = true;
    let mut result = Ok(());
    DEVICE.for_each_pool(|device, pool| {
        let p = &pool.stats;
        let sep = if core::mem::take(&mut first) { "" } else { "," };
        result = result.and_then(|_| {
            write!(
                w,
                "{sep}{{\"device\":{device},\"requests\":{},\"hits\":{},\"segments_mapped\":{},\"segments_released\":{},\"syncs\":{},\"oom_retries\":{},\"oom_failures\":{},\"live_bytes\":{},\"peak_live_bytes\":{},\"reserved_bytes\":{},\"peak_reserved_bytes\":{},\"resets\":{},\"ipc_exports\":{},\"idle_released_segments\":{},\"idle_released_bytes\":{},\"pressure_released_segments\":{},\"pressure_released_bytes\":{},\"neighbour_released_segments\":{},\"neighbour_released_bytes\":{}}}",
                p.requests, p.hits, p.segments_mapped, p.segments_released, p.syncs, p.oom_retries, p.oom_failures,
                p.live_bytes, p.peak_live_bytes, p.reserved_bytes, p.peak_reserved_bytes, p.resets, p.ipc_exports,
                p.idle_released_segments, p.idle_released_bytes, p.pressure_released_segments, p.pressure_released_bytes, p.neighbour_released_segments, p.neighbour_released_bytes
            )
        });
    });
    result?;
    write!(w, "],\"cuda_passed_through\":{},", DEVICE.stats.passthrough.get())?;
    write!(
        w,
        "\"pinned\":{{\"requests\":{},\"hits\":{},\"cached_bytes\":{},\"peak_cached_bytes\":{}}},",
        s.pinned_requests, s.pinned_hits, s.pinned_cached_bytes, s.pinned_peak_cached_bytes
    )?;
    w.write_str("\"holders\":")?;
    crate::report::holders::write_json(w, &crate::report::holders::Table::gather())?;
    w.write_str(",\"last_oom\":")?;
    crate::report::oom::write_json(w)?;
    w.write_str(",")?;
    w.write_str("\"phases\":[")?;
    for (i, (indent, name, t)) in phase_rows().iter().enumerate() {
        if i > 0 {
            w.write_str(",")?;
        }
        write!(
            w,
            "{{\"name\":\"{}\",\"depth\":{},\"calls\":{},\"total_ns\":{}}}",
            name,
            indent,
            t.calls.get(),
            t.total_ns.get()
        )?;
    }
    w.write_str("]}\n")
}


/// The process made a large host request or a CUDA call through us (the runtime or the driver
/// bound, whatever the pool's setting); with the cache off (TENSORMALLOC_DISABLE, which counts
/// no request), always: the report then says what passed through.
pub(crate) fn did_anything() -> bool {
    !HOST.is_enabled() || HOST.stats.requests.get() > 0 || crate::sys::cuda_runtime::is_bound() || crate::sys::cuda_driver::is_bound()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::stderr::StackWriter;

    #[test]
    fn text_report_has_the_phase_table() {
        let mut w = StackWriter::<8192>::new();
        write_text(&mut w, &Snapshot { host_requests: 10, host_hits: 9, ..Default::default() }).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("hits 9 (90.0%)"), "{text}");
        assert!(text.contains("Section") && text.contains("idle release (madvise)"), "{text}");
        assert!(text.contains(" %tot: share of the time spent inside tensormalloc's"), "{text}");
        assert!(text.contains("cached 0 B in 0 blocks") && text.contains("released 0 blocks"), "{text}");
        let mut w = StackWriter::<8192>::new();
        write_text(&mut w, &Snapshot { host_cached_blocks: 1, host_released_blocks: 1, ..Default::default() }).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("in 1 block (") && text.contains("released 1 block,"), "{text}");
    }

    /// Every word the text report names a figure with is the JSON's name for it (host_grows was
    /// "gathered", host_hit_bytes "served from cache"...): the labels are JSON keys, `_` as ` `.
    #[test]
    fn the_texts_words_are_the_jsons_names() {
        let mut w = StackWriter::<16384>::new();
        write_text(&mut w, &Snapshot::default()).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap().to_owned();
        let mut j = StackWriter::<65536>::new();
        write_json(&mut j, &Snapshot::default(), Ending::Exit).unwrap();
        let json = std::str::from_utf8(j.as_bytes()).unwrap().to_owned();
        let host_line = |start: &str| text.lines().find(|l| l.starts_with(start)).unwrap().to_owned();
        let labels = [host_line("  requests"), host_line("  released"), host_line("  bound")].join(" ");
        for word in ["requests", "hits", "grows", "misses", "hit bytes", "frees", "released", "unmapped", "deferred unmap",
                     "map failures", "calloc zeroed by discard", "unresettable blocks", "reset blocks", "retries after trim"] {
            assert!(labels.contains(word), "{word} not in {labels}");
            assert!(json.contains(&format!("\"{}", word.replace(' ', "_"))), "{word}: no such JSON name");
        }
        for stale in ["gathered", "served from cache", "lazily freed", "mmap failures", "given back", "waiting for"] {
            assert!(!text.contains(stale), "{stale}");
        }
    }
}
