//! The driver's graph-capture entry points, every spelling (linked, by name, through
//! `cuGetProcAddress`: `cuda_lookup.rs` hands these out): each is one call into
//! `route::cuda::captures`, which counts the captures under way (Note [Graph captures under
//! way] in device/device_layer/captures.rs).

use crate::route::cuda::captures as route;
use core::ffi::{c_int, c_void};

/// # Safety
/// As cuStreamBeginCapture (CUDA 10.0's).
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: *mut c_void) -> c_int {
    route::begin(stream, |d| d.begin_capture_v1, |f| f(stream))
}

/// # Safety
/// As cuStreamBeginCapture_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(stream: *mut c_void) -> c_int {
    route::begin(stream, |d| d.begin_capture_v1_ptsz, |f| f(stream))
}

/// # Safety
/// As cuStreamBeginCapture_v2.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: c_int) -> c_int {
    route::begin(stream, |d| d.begin_capture, |f| f(stream, mode))
}

/// # Safety
/// As cuStreamBeginCapture_v2_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: *mut c_void, mode: c_int) -> c_int {
    route::begin(stream, |d| d.begin_capture_ptsz, |f| f(stream, mode))
}

/// # Safety
/// As cuStreamBeginCaptureToGraph.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(stream: *mut c_void, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, mode: c_int) -> c_int {
    route::begin(stream, |d| d.begin_capture_to_graph, |f| f(stream, graph, deps, edges, count, mode))
}

/// # Safety
/// As cuStreamBeginCaptureToGraph_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(stream: *mut c_void, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, mode: c_int) -> c_int {
    route::begin(stream, |d| d.begin_capture_to_graph_ptsz, |f| f(stream, graph, deps, edges, count, mode))
}

/// # Safety
/// As cuStreamEndCapture.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> c_int {
    route::end(stream, graph, |d| d.end_capture)
}

/// # Safety
/// As cuStreamEndCapture_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(stream: *mut c_void, graph: *mut *mut c_void) -> c_int {
    route::end(stream, graph, |d| d.end_capture_ptsz)
}
