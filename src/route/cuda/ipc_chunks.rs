//! IPC of pooled blocks in expandable segments, routed (Note [IPC of expandable segments] in
//! device/pool/exports.rs). Exporting: the chunks under the block get descriptors of their memory
//! (the device layer), this process serves them to peers from now on (device/ipc/channel.rs), and
//! the block is published in the registry and marked: the handle is ours. Opening one: the chunk
//! run fetched from its exporter, imported and mapped side by side in address space of our own,
//! made accessible to the current device, once per process and block (`OPENED`); the last close
//! unmaps it and frees the address space. Each way it cannot work is said once, naming
//! TENSORMALLOC_CUDA_SEGMENTS=classic, and answered with the driver's (or the system's) error.

use crate::backing::{DeviceError, CUDA_ERROR_INVALID_VALUE};
use crate::device::device_layer::ExpandableBlock;
use crate::device::ipc::channel::{self, Fetch, Unavailable};
use crate::device::ipc::handle::{ChunkRun, Handle};
use crate::device::ipc::{self, Published, OPENED};
use crate::state::DEVICE;
use crate::sys::{cuda_shareable, process};
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// CUDA_ERROR_OPERATING_SYSTEM (the runtime's cudaErrorOperatingSystem has the same value): a
/// system call the sharing needs failed.
const CUDA_ERROR_OPERATING_SYSTEM: c_int = 304;

/// The registry's record of block `b`: its chunk run, and its place in it.
fn published(b: &ExpandableBlock) -> Published {
    let run = ChunkRun { device: b.device as u32, addr: b.addr, buffer_id: b.buffer_id, chunk_bytes: b.chunk_bytes, first_chunk: b.first_chunk, chunks: b.chunks };
    Published { real: run.encode(), offset: b.addr - b.first_chunk, size: b.size, segment_len: run.bytes() }
}

/// What the channel hands a peer: duplicates of the descriptors of the chunks of `run`'s block.
fn fds_for_peer(run: &ChunkRun, entry: u32, first: u64, out: &mut [i32]) -> Option<usize> {
    DEVICE.exported_fds(run.device as usize, run.addr, run.buffer_id, entry, first, out)
}

/// Why an export cannot work.
enum Cannot {
    Driver(c_int),
    Channel(Unavailable),
}

fn say_cannot_export(call: &str, b: &ExpandableBlock, why: Cannot) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Relaxed) {
        return;
    }
    let mut buf = [0u8; 128];
    let (what, code) = match why {
        Cannot::Driver(code) => ("the driver gives no file descriptor of their memory (a driver or device without POSIX file descriptor handles for its virtual memory API)", code),
        Cannot::Channel(Unavailable::NoThread) => ("no thread could be started to hand it to other processes", CUDA_ERROR_OPERATING_SYSTEM),
        Cannot::Channel(Unavailable::Socket(e)) => (process::error_text(e, &mut buf), CUDA_ERROR_OPERATING_SYSTEM),
    };
    crate::warn_line!(
        "{}({:#x}): the pooled block ({} bytes) lies in an expandable segment (TENSORMALLOC_CUDA_SEGMENTS=expandable), whose chunks cannot be shared: {}; refused (error {}). IPC of pooled memory works with TENSORMALLOC_CUDA_SEGMENTS=classic (said once)",
        call, b.addr, b.size, what, code
    );
}

/// An export of expandable block `b`: our handle; None when the block was freed or named by
/// another export meanwhile (the caller looks again); the code it is refused with.
pub(super) fn export(call: &str, b: &ExpandableBlock) -> Result<Option<[u8; 64]>, c_int> {
    let what = published(b);
    if let Some(entry) = b.entry {
        return Ok(ipc::handle_of(entry, &what).map(|h| h.encode()));
    }
    match DEVICE.export_chunks(b) {
        Ok(()) => {}
        Err(DeviceError::Other(CUDA_ERROR_INVALID_VALUE)) if !DEVICE.is_live_block(b.device, b.addr, b.buffer_id) => return Ok(None),
        Err(e) => {
            say_cannot_export(call, b, Cannot::Driver(e.code()));
            return Err(e.code());
        }
    }
    if let Err(why) = channel::serve(fds_for_peer) {
        say_cannot_export(call, b, Cannot::Channel(why));
        return Err(CUDA_ERROR_OPERATING_SYSTEM);
    }
    let Some((handle, entry)) = ipc::publish(&what) else { return Err(CUDA_ERROR_INVALID_VALUE) };
    if !DEVICE.mark_export(b.device, b.addr, b.buffer_id, entry) {
        ipc::withdraw(entry);
        return Ok(None);
    }
    ipc::say_ours();
    Ok(Some(handle.encode()))
}

fn say_unreachable(h: &Handle, why: Fetch) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Relaxed) {
        return;
    }
    let mut buf = [0u8; 128];
    let mut name = [0u8; 64];
    let name = core::str::from_utf8(channel::socket_name(process::user_id(), h.pid, h.channel, &mut name)).unwrap_or("");
    let text = match why {
        Fetch::WrongPeer(p) => {
            crate::warn_line!(
                "cuIpcOpenMemHandle: a tensormalloc handle from process {} names a block of an expandable segment, whose memory that process hands out over the socket @{}, which process {} holds instead; refused (error {}). IPC of pooled memory works with TENSORMALLOC_CUDA_SEGMENTS=classic in the exporting process (said once)",
                h.pid, name, p.pid, CUDA_ERROR_OPERATING_SYSTEM
            );
            return;
        }
        Fetch::Unreachable(0) => "it closed the connection",
        Fetch::Unreachable(e) => process::error_text(e, &mut buf),
        Fetch::NotLive | Fetch::Map(_) => "",
    };
    crate::warn_line!(
        "cuIpcOpenMemHandle: a tensormalloc handle from process {} names a block of an expandable segment, whose memory that process hands out over the socket @{}: {}; refused (error {}). IPC of pooled memory works with TENSORMALLOC_CUDA_SEGMENTS=classic in the exporting process (said once)",
        h.pid, name, text, CUDA_ERROR_OPERATING_SYSTEM
    );
}

fn say_exporter_ended(h: &Handle) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::warn_line!("cuIpcOpenMemHandle: a tensormalloc handle from process {}, which has ended; refused with invalid value, as the driver refuses a handle whose exporter is gone (said once)", h.pid);
    }
}

/// Maps the chunk run of handle `h`'s block, fetched from its exporter: the run's base.
fn map_run(h: &Handle, run: &ChunkRun) -> Result<u64, c_int> {
    let (len, chunk) = (run.bytes(), run.chunk_bytes);
    let base = cuda_shareable::reserve(len, chunk).map_err(|e| e.code())?;
    let mut mapped = 0u64;
    let fetched = channel::fetch(h, run.chunks, |k, fd| {
        if k != mapped {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        cuda_shareable::map_imported(base + k * chunk, chunk, fd).map_err(|e| e.code())?;
        mapped += 1;
        Ok(())
    });
    let fetched = fetched.and_then(|()| cuda_shareable::allow_current_device(base, len).map_err(|e| Fetch::Map(e.code())));
    let Err(why) = fetched else { return Ok(base) };
    let _ = cuda_shareable::unmap_imported(base, chunk, mapped, len);
    Err(match why {
        Fetch::Map(code) => code,
        Fetch::NotLive => {
            ipc::say_not_live(h);
            CUDA_ERROR_INVALID_VALUE
        }
        // The exporter has ended: the driver refuses a handle whose exporter is gone with
        // invalid value, and no setting of its would have helped (error 304 and a hint to use
        // classic segments there misled: the torchsim hunter).
        Fetch::Unreachable(_) if ipc::exporter_ended(h) => {
            say_exporter_ended(h);
            CUDA_ERROR_INVALID_VALUE
        }
        Fetch::Unreachable(_) | Fetch::WrongPeer(_) => {
            say_unreachable(h, why);
            CUDA_ERROR_OPERATING_SYSTEM
        }
    })
}

/// Opens handle `h`, whose registry entry `what` names chunk run `run`: the block's pointer.
pub(super) fn open(h: &Handle, what: &Published, run: &ChunkRun) -> Result<u64, c_int> {
    let unmap = |base| {
        let _ = cuda_shareable::unmap_imported(base, run.chunk_bytes, run.chunks, run.bytes());
    };
    OPENED.open_once(&what.real, [u64::from(h.pid), h.channel], (what.offset, what.size), || map_run(h, run), unmap, crate::sys::clock::pause)
}

/// The last close of a chunk run opened at `base`: unmapped, its address space freed.
pub(super) fn close(base: u64, run: &ChunkRun) -> c_int {
    match cuda_shareable::unmap_imported(base, run.chunk_bytes, run.chunks, run.bytes()) {
        Ok(()) => 0,
        Err(e) => e.code(),
    }
}
