//! Unix stream sockets in the abstract namespace, with descriptors passed along (SCM_RIGHTS): the
//! channel that carries exported expandable chunks' memory to a peer (device/ipc/channel.rs). Made
//! only on that path: a process that never exports or opens such a handle makes no socket. An
//! abstract name leaves no file behind and goes with its last holder; who is at the other end
//! is told by the kernel (SO_PEERCRED), never by the bytes.

use super::cancel::cancel_held;
use core::mem::{size_of, zeroed};

/// The process at the other end of a connection, as the kernel saw it when it connected (or,
/// for a listener, when it listened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
}

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 64;

fn errno() -> i32 {
    super::process::errno()
}

/// The abstract address `name` (a leading NUL, then the name); None when it does not fit.
fn address(name: &[u8]) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data, for which all zeroes is a value.
    let mut a: libc::sockaddr_un = unsafe { zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = a.sun_path.get_mut(1..1 + name.len())?;
    for (dst, &b) in path.iter_mut().zip(name) {
        *dst = b as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + 1 + name.len();
    Some((a, len as libc::socklen_t))
}

fn stream() -> Result<i32, i32> {
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// A listening socket bound to abstract name `name`; the errno when the system refuses
/// (EADDRINUSE: another process holds the name).
pub fn listen(name: &[u8]) -> Result<i32, i32> {
    let (a, len) = address(name).ok_or(libc::ENAMETOOLONG)?;
    let fd = stream()?;
    // SAFETY: an address on our stack of the length given; a socket we own.
    let ok = unsafe { libc::bind(fd, (&a as *const libc::sockaddr_un).cast(), len) == 0 && libc::listen(fd, 16) == 0 };
    if ok {
        return Ok(fd);
    }
    let e = errno();
    let _ = super::files::close(fd);
    Err(e)
}

/// The next connection to `listener` (waits for one); the errno on failure.
pub fn accept(listener: i32) -> Result<i32, i32> {
    loop {
        // SAFETY: a listening socket we own; no address wanted.
        let fd = cancel_held(|| unsafe { libc::accept4(listener, core::ptr::null_mut(), core::ptr::null_mut(), libc::SOCK_CLOEXEC) });
        if fd >= 0 {
            return Ok(fd);
        }
        if errno() != libc::EINTR {
            return Err(errno());
        }
    }
}

/// A socket connected to abstract name `name`, whose every send and receive waits at most
/// `wait_ns` (as this connect does, should the listener's backlog be full); the errno when no one
/// listens there, the wait ran out, or the system refuses.
pub fn connect(name: &[u8], wait_ns: u64) -> Result<i32, i32> {
    let (a, len) = address(name).ok_or(libc::ENAMETOOLONG)?;
    let fd = stream()?;
    let deadline = super::clock::now_ns().saturating_add(wait_ns);
    loop {
        let e = if !wait_until(fd, deadline) {
            libc::EAGAIN
        // SAFETY: an address on our stack of the length given; a socket we own.
        } else if cancel_held(|| unsafe { libc::connect(fd, (&a as *const libc::sockaddr_un).cast(), len) }) == 0 {
            return Ok(fd);
        } else {
            errno()
        };
        if e != libc::EINTR {
            let _ = super::files::close(fd);
            return Err(e);
        }
    }
}

/// Who is at the other end of `fd`.
pub fn peer(fd: i32) -> Option<Peer> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above, on a socket we own.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) };
    (rc == 0 && cred.pid > 0).then_some(Peer { pid: cred.pid as u32, uid: cred.uid })
}

/// Sets `fd`'s send and receive timeouts to the time left before `deadline` (CLOCK_MONOTONIC);
/// false once under a microsecond is left, which the kernel would read as no timeout at all.
/// Each call resets them, since a signal makes a timed wait fail with EINTR even under
/// SA_RESTART (signal(7)) and a retry with the whole timeout again could wait forever under a
/// profiler's periodic timer.
fn wait_until(fd: i32, deadline: u64) -> bool {
    let left = deadline.saturating_sub(super::clock::now_ns());
    if left < 1_000 {
        return false;
    }
    let t = super::clock::timespec(left);
    let tv = libc::timeval { tv_sec: t.tv_sec, tv_usec: t.tv_nsec / 1000 };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: a timeval on our stack, on a socket we own.
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, opt, (&tv as *const libc::timeval).cast(), size_of::<libc::timeval>() as libc::socklen_t) };
    }
    true
}

/// Control-message room for MAX_FDS descriptors, aligned as cmsghdr wants.
#[repr(C, align(8))]
struct Control([u8; 16 + 4 * MAX_FDS]);

/// Sends `bytes` with descriptors `fds` (at most MAX_FDS) attached, waiting at most `wait_ns` for
/// room; the errno on failure (EAGAIN: the wait ran out).
pub fn send(fd: i32, bytes: &[u8], fds: &[i32], wait_ns: u64) -> Result<(), i32> {
    if fds.len() > MAX_FDS || bytes.is_empty() {
        return Err(libc::EINVAL);
    }
    let mut control = Control([0; 16 + 4 * MAX_FDS]);
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: msghdr is plain data; every pointer set below points to our stack and lives across
    // the call; CMSG_* walk the control buffer we sized for MAX_FDS descriptors.
    unsafe {
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let data_len = (4 * fds.len()) as u32;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(data_len) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
            core::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), 4 * fds.len());
        }
        let deadline = super::clock::now_ns().saturating_add(wait_ns);
        loop {
            if !wait_until(fd, deadline) {
                return Err(libc::EAGAIN);
            }
            let n = cancel_held(|| libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL));
            if n == bytes.len() as isize {
                return Ok(());
            }
            if n >= 0 {
                return Err(libc::EMSGSIZE); // our messages are small: sent whole or not at all
            }
            if errno() != libc::EINTR {
                return Err(errno());
            }
        }
    }
}

/// Receives exactly `bytes.len()` bytes within `wait_ns`, and the descriptors that came with them
/// into `fds` (close-on-exec); how many descriptors. The errno on failure (0: the peer closed;
/// EAGAIN: the wait ran out), with every descriptor received closed.
pub fn recv(fd: i32, bytes: &mut [u8], fds: &mut [i32], wait_ns: u64) -> Result<usize, i32> {
    let mut got = 0;
    let mut nfds = 0;
    let deadline = super::clock::now_ns().saturating_add(wait_ns);
    while got < bytes.len() {
        if !wait_until(fd, deadline) {
            close_all(fds.get(..nfds).unwrap_or(&[]));
            return Err(libc::EAGAIN);
        }
        let mut control = Control([0; 16 + 4 * MAX_FDS]);
        let rest = bytes.get_mut(got..).unwrap_or(&mut []);
        let mut iov = libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() };
        // SAFETY: as in `send`; the kernel writes at most iov_len bytes and msg_controllen bytes
        // of control data into our buffers.
        let (n, truncated) = unsafe {
            let mut msg: libc::msghdr = zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = control.0.len() as _;
            let n = cancel_held(|| libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC));
            if n > 0 {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let count = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize) / 4;
                        let data = libc::CMSG_DATA(c);
                        for k in 0..count {
                            let received = data.add(4 * k).cast::<i32>().read_unaligned();
                            match fds.get_mut(nfds) {
                                Some(slot) => {
                                    *slot = received;
                                    nfds += 1;
                                }
                                None => {
                                    let _ = super::files::close(received);
                                }
                            }
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            (n, msg.msg_flags & libc::MSG_CTRUNC != 0)
        };
        let failed = match n {
            n if n < 0 && errno() == libc::EINTR => None,
            n if n < 0 => Some(errno()),
            0 => Some(0),
            _ if truncated => Some(libc::EMSGSIZE),
            n => {
                got += n as usize;
                None
            }
        };
        if let Some(e) = failed {
            close_all(fds.get(..nfds).unwrap_or(&[]));
            return Err(e);
        }
    }
    Ok(nfds)
}

fn close_all(fds: &[i32]) {
    for &f in fds {
        let _ = super::files::close(f);
    }
}

/// A close-on-exec duplicate of `fd`; None when the system refuses.
pub fn dup(fd: i32) -> Option<i32> {
    // SAFETY: plain fcntl on a descriptor the caller holds.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    (d >= 0).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_travel_with_their_bytes_and_the_kernel_names_the_peer() {
        let name = format!("tensormalloc-test-{}-{}", std::process::id(), line!());
        let listener = listen(name.as_bytes()).unwrap();
        assert_eq!(listen(name.as_bytes()), Err(libc::EADDRINUSE), "a name is held once");
        let client = connect(name.as_bytes(), 1_000_000_000).unwrap();
        let server = accept(listener).unwrap();
        let me = Peer { pid: std::process::id(), uid: unsafe { libc::geteuid() } };
        assert_eq!(peer(client), Some(me));
        assert_eq!(peer(server), Some(me));
        let (r, w) = crate::sys::files::pipe();
        send(server, b"hello", &[r, w], 1_000_000_000).unwrap();
        let mut bytes = [0u8; 5];
        let mut fds = [-1i32; 4];
        assert_eq!(recv(client, &mut bytes, &mut fds, 1_000_000_000), Ok(2));
        assert_eq!(&bytes, b"hello");
        // The received write end reaches the original read end.
        crate::sys::files::write_all(fds[1], b"x").unwrap();
        let mut one = [0u8; 1];
        assert_eq!(unsafe { libc::read(r, one.as_mut_ptr().cast(), 1) }, 1);
        for fd in [r, w, fds[0], fds[1], server] {
            crate::sys::files::close(fd).unwrap();
        }
        assert_eq!(recv(client, &mut bytes, &mut fds, 10_000_000), Err(0), "the peer closed");
        for fd in [client, listener] {
            crate::sys::files::close(fd).unwrap();
        }
        assert_eq!(connect(name.as_bytes(), 1_000_000_000), Err(libc::ECONNREFUSED), "the name went with its listener");
    }
}
