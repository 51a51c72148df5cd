//! How much memory this process may use: physical memory (sysinfo), or less when its cgroup has
//! a limit (v2 `memory.max`, v1 `memory.limit_in_bytes`, on its own cgroup and every ancestor).
//! Read once at init with raw system calls into stack buffers: no allocation, no locks. The
//! parsing is pure and unit-tested.

use core::sync::atomic::{AtomicU64, Ordering};

const BUF: usize = 512;

/// What the process may use: min(physical memory, its cgroup's memory limit), and whether the
/// cgroup's limit is the lower (read once, at init).
pub fn usable_bytes() -> (u64, bool) {
    let phys = system_memory().map_or(u64::MAX, |(ram, _)| ram);
    let limit = cgroup_limit_bytes();
    (phys.min(limit), limit < phys)
}

/// The memory limit of the process's cgroup or an ancestor's (v2 `memory.max`, v1
/// `memory.limit_in_bytes`); u64::MAX for none.
pub fn cgroup_limit_bytes() -> u64 {
    let mut cgroup = [0u8; BUF];
    let Some(n) = read_file(b"/proc/self/cgroup\0", &mut cgroup) else { return u64::MAX };
    let text = cgroup.get(..n).unwrap_or(&[]);
    let mut limit = u64::MAX;
    // v2 inside a cgroup namespace (containers): the cgroup is the mount's root.
    limit = limit.min(read_limit(b"/sys/fs/cgroup/", b"", b"memory.max"));
    if let Some(path) = cgroup_path(text, b"") {
        limit = limit.min(limit_up_the_tree(b"/sys/fs/cgroup", path, b"memory.max"));
    }
    if let Some(path) = cgroup_path(text, b"memory") {
        limit = limit.min(limit_up_the_tree(b"/sys/fs/cgroup/memory", path, b"memory.limit_in_bytes"));
    }
    limit
}

/// The system's commit limit under strict overcommit (`vm.overcommit_memory=2`), read at init
/// and again by `refresh_commit_limit`; u64::MAX otherwise.
static COMMIT_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);
/// When the background pass last read it (coarse ns).
static COMMIT_READ_NS: AtomicU64 = AtomicU64::new(0);
/// How often the background pass reads the overcommit mode again.
const COMMIT_READ_EVERY_NS: u64 = 1_000_000_000;

/// Reads the commit limit (init): one file read, two under strict overcommit. A mode that cannot
/// be read counts as no limit.
pub fn read_commit_limit() {
    let limit = if overcommit_mode() == Some(b'2') {
        with_meminfo(|text| meminfo_kib(text, b"CommitLimit:")).flatten().map_or(u64::MAX, |k| k.saturating_mul(1024))
    } else {
        u64::MAX
    };
    COMMIT_LIMIT.store(limit, Ordering::Relaxed);
}

/// In the background pass: the commit limit read again at most once a second, since an
/// administrator may switch strict overcommit on or off while we run (Note [Room for others] in
/// host/host_layer/release.rs).
pub fn refresh_commit_limit(now_ns: u64) {
    let last = COMMIT_READ_NS.load(Ordering::Relaxed);
    if last != 0 && now_ns.saturating_sub(last) < COMMIT_READ_EVERY_NS {
        return;
    }
    COMMIT_READ_NS.store(now_ns.max(1), Ordering::Relaxed);
    read_commit_limit();
}

/// `vm.overcommit_memory`'s digit (b'0' heuristic, b'1' always, b'2' strict); None if unreadable.
fn overcommit_mode() -> Option<u8> {
    let mut mode = [0u8; 8];
    let n = read_file(b"/proc/sys/vm/overcommit_memory\0", &mut mode)?;
    mode.get(..n)?.first().copied()
}

/// Physical memory and swap in bytes (sysinfo).
fn system_memory() -> Option<(u64, u64)> {
    // SAFETY: sysinfo fills the struct we own.
    unsafe {
        let mut info: libc::sysinfo = core::mem::zeroed();
        (libc::sysinfo(&mut info) == 0).then(|| {
            let unit = u64::from(info.mem_unit.max(1));
            ((info.totalram as u64).saturating_mul(unit), (info.totalswap as u64).saturating_mul(unit))
        })
    }
}

/// `f` over the text of /proc/meminfo, read into a stack buffer; None if unreadable.
fn with_meminfo<R>(f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let mut meminfo = [0u8; 4096];
    let n = read_file(b"/proc/meminfo\0", &mut meminfo)?;
    Some(f(meminfo.get(..n).unwrap_or(&[])))
}

/// A soft resource limit now (one system call: a program may set it at any time); u64::MAX for
/// none.
pub(super) fn soft_limit(resource: libc::__rlimit_resource_t) -> u64 {
    // SAFETY: getrlimit fills the struct we own.
    unsafe {
        let mut rl: libc::rlimit = core::mem::zeroed();
        if libc::getrlimit(resource, &mut rl) == 0 && rl.rlim_cur != libc::RLIM_INFINITY {
            return rl.rlim_cur;
        }
    }
    u64::MAX
}

/// The most address space this process may map: `RLIMIT_AS` now, and the commit limit under
/// strict overcommit; u64::MAX with neither.
pub fn address_space_bytes() -> u64 {
    COMMIT_LIMIT.load(Ordering::Relaxed).min(soft_limit(libc::RLIMIT_AS))
}

/// The most this process may map privately writable, as every block of ours is: the address
/// space (`address_space_bytes`) and `RLIMIT_DATA`, which since Linux 4.7 counts such mappings
/// beside brk's heap (`ulimit -d`, systemd's `LimitDATA=`, Python's `resource.setrlimit`: the
/// cap of choice where CUDA's reservations make `RLIMIT_AS` useless). Cached blocks count
/// against each, MADV_FREE'd or not (Note [Room for others] in host/host_layer/release.rs).
pub fn mapping_limit_bytes() -> u64 {
    address_space_bytes().min(soft_limit(libc::RLIMIT_DATA))
}

/// The largest single mapping that could succeed were every cached block unmapped: the
/// address-space limit, or, under the kernel's default heuristic overcommit, physical memory
/// and swap (a larger request is refused whatever we hold). Read when a mapping has failed.
pub fn largest_possible_mapping() -> u64 {
    let largest = address_space_bytes();
    match (overcommit_mode(), system_memory()) {
        (None | Some(b'0'), Some((ram, swap))) => largest.min(ram.saturating_add(swap)),
        _ => largest,
    }
}

/// A `Name:   123 kB` line of /proc/meminfo, in KiB.
pub fn meminfo_kib(text: &[u8], name: &[u8]) -> Option<u64> {
    let line = text.split(|&b| b == b'\n').find(|l| l.starts_with(name))?;
    let digits: &[u8] = line.get(name.len()..)?;
    let start = digits.iter().position(|b| b.is_ascii_digit())?;
    let rest = digits.get(start..)?;
    let end = rest.iter().position(|b| !b.is_ascii_digit()).unwrap_or(rest.len());
    crate::config::parse_u64(rest.get(..end)?)
}

/// Whether the process's memory nears a limit: its cgroup's (v1 `memory.usage_in_bytes` against
/// `memory.limit_in_bytes`; v2 `memory.current` against `memory.max` and `memory.high`; on its
/// own cgroup and every ancestor), or the system's (MemAvailable under an eighth of MemTotal).
/// Read by the background thread before it releases idle blocks (Note [What RSS shows] in
/// host/host_layer/release.rs): a few small reads, off the allocation paths.
pub fn near_limit() -> bool {
    let system_short = with_meminfo(|text| match (meminfo_kib(text, b"MemAvailable:"), meminfo_kib(text, b"MemTotal:")) {
        (Some(available), Some(total)) => total.saturating_sub(available) >= total.saturating_mul(7) / 8,
        _ => false,
    });
    if system_short == Some(true) {
        return true;
    }
    let mut cgroup = [0u8; BUF];
    let Some(n) = read_file(b"/proc/self/cgroup\0", &mut cgroup) else { return false };
    let text = cgroup.get(..n).unwrap_or(&[]);
    let v2 = |dir: &[u8]| {
        let current = read_limit(b"/sys/fs/cgroup", dir, b"memory.current");
        [b"memory.max".as_slice(), b"memory.high"].iter().any(|f| near(current, read_limit(b"/sys/fs/cgroup", dir, f)))
    };
    let v1 = |dir: &[u8]| near(read_limit(b"/sys/fs/cgroup/memory", dir, b"memory.usage_in_bytes"), read_limit(b"/sys/fs/cgroup/memory", dir, b"memory.limit_in_bytes"));
    cgroup_path(text, b"").is_some_and(|p| up_the_tree(p, v2)) || cgroup_path(text, b"memory").is_some_and(|p| up_the_tree(p, v1))
}

/// Usage at three quarters of a limit or more: near it. u64::MAX stands for "unreadable" or
/// "no limit".
pub fn near(usage: u64, limit: u64) -> bool {
    usage != u64::MAX && limit != u64::MAX && usage >= limit / 4 * 3
}

/// Visits `path` and each of its ancestors, stopping at the first for which `visit` is true;
/// whether one was.
fn up_the_tree(path: &[u8], mut visit: impl FnMut(&[u8]) -> bool) -> bool {
    let mut at = path;
    loop {
        if visit(at) {
            return true;
        }
        match at.iter().rposition(|&b| b == b'/') {
            Some(slash) if !at.is_empty() => at = at.get(..slash).unwrap_or(&[]),
            _ => return false,
        }
    }
}

/// The path of the cgroup that has `controller` in `/proc/self/cgroup` (empty: the v2 line,
/// `0::/path`).
pub fn cgroup_path<'a>(text: &'a [u8], controller: &[u8]) -> Option<&'a [u8]> {
    text.split(|&b| b == b'\n').find_map(|line| {
        let mut fields = line.splitn(3, |&b| b == b':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let matches = if controller.is_empty() { controllers.is_empty() } else { controllers.split(|&b| b == b',').any(|c| c == controller) };
        matches.then_some(path)
    })
}

/// A limit file's value: bytes, or None for `max` (v2's "no limit") and anything unreadable.
pub fn parse_limit(text: &[u8]) -> Option<u64> {
    let digits = text.strip_suffix(b"\n").unwrap_or(text);
    crate::config::parse_u64(digits)
}

/// The smallest limit on `path` and each of its ancestors under `root`.
fn limit_up_the_tree(root: &[u8], path: &[u8], file: &[u8]) -> u64 {
    let mut limit = u64::MAX;
    up_the_tree(path, |dir| {
        limit = limit.min(read_limit(root, dir, file));
        false
    });
    limit
}

/// `root` + `dir` + "/" + `file`, read and parsed; u64::MAX when absent or `max`.
fn read_limit(root: &[u8], dir: &[u8], file: &[u8]) -> u64 {
    let mut path = [0u8; BUF];
    let mut len = 0;
    for part in [root, dir, b"/", file, b"\0"] {
        let Some(dst) = path.get_mut(len..len + part.len()) else { return u64::MAX };
        dst.copy_from_slice(part);
        len += part.len();
    }
    let mut buf = [0u8; 64];
    read_file(path.get(..len).unwrap_or(b"\0"), &mut buf).and_then(|n| parse_limit(buf.get(..n)?)).unwrap_or(u64::MAX)
}

/// The process's resident set size, from /proc/self/statm (0 when it cannot be read).
pub fn resident_bytes() -> u64 {
    let mut buf = [0u8; 128];
    let n = read_file(b"/proc/self/statm\0", &mut buf).unwrap_or(0);
    let text = buf.get(..n).unwrap_or(&[]);
    let resident_pages = text.split(|&b| b == b' ').nth(1).and_then(crate::config::parse_u64).unwrap_or(0);
    resident_pages * 4096
}

use super::files::read_small as read_file;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup_of_each_hierarchy() {
        let v1 = b"9:name=systemd:/\n4:memory:/process_api/12eb\n3:cpu,cpuacct:/x\n0::/\n";
        assert_eq!(cgroup_path(v1, b"memory"), Some(&b"/process_api/12eb"[..]));
        assert_eq!(cgroup_path(v1, b"cpuacct"), Some(&b"/x"[..]));
        assert_eq!(cgroup_path(v1, b""), Some(&b"/"[..]));
        assert_eq!(cgroup_path(b"0::/user.slice/a.scope\n", b""), Some(&b"/user.slice/a.scope"[..]));
        assert_eq!(cgroup_path(b"0::/a\n", b"memory"), None);
        assert_eq!(cgroup_path(b"garbage", b""), None);
    }

    #[test]
    fn reads_limits() {
        assert_eq!(parse_limit(b"max\n"), None);
        assert_eq!(parse_limit(b"4294967296\n"), Some(4 << 30));
        assert_eq!(parse_limit(b""), None);
    }

    #[test]
    fn near_a_limit_from_three_quarters() {
        assert!(!near(500, 1000) && near(750, 1000) && near(999, 1000));
        assert!(!near(u64::MAX, 1000) && !near(10, u64::MAX), "unreadable or unlimited: not near");
        let _ = near_limit(); // reads this machine's files without failing
    }

    #[test]
    fn reads_meminfo() {
        let text = b"MemTotal:       24576000 kB\nCommitLimit:    12288000 kB\nCommitted_AS:    100 kB\n";
        assert_eq!(meminfo_kib(text, b"CommitLimit:"), Some(12_288_000));
        assert_eq!(meminfo_kib(text, b"MemTotal:"), Some(24_576_000));
        assert_eq!(meminfo_kib(text, b"SwapTotal:"), None);
        assert_eq!(meminfo_kib(b"CommitLimit:\n", b"CommitLimit:"), None);
    }

    #[test]
    fn address_space_limits_are_read() {
        assert!(address_space_bytes() > 0);
        assert!(mapping_limit_bytes() > 0 && mapping_limit_bytes() <= address_space_bytes());
        assert!(largest_possible_mapping() > 1 << 20 && largest_possible_mapping() <= address_space_bytes());
    }

    #[test]
    fn usable_memory_is_some_and_at_most_physical() {
        let (usable, _) = usable_bytes();
        assert!(usable > 0 && usable < u64::MAX);
    }
}
