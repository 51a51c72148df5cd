"""Opening the files `tensormalloc report` and `tensormalloc plot` read and write, as the library
opens its own (Note [Files others can reach] in src/sys/files.rs): a file read is opened without
blocking (a FIFO or a device never hangs us), without following a link, and refused unless it is
a regular file of ours with one link; a file written is made under an unpredictable name with
O_EXCL, 0600, and renamed over the target only when what stands there is a file of ours."""
import errno
import os
import secrets
import stat


class Refused(Exception):
    """A file not read or not written, and why, in words."""


def _why(st):
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, a device, a socket or a directory)"
    if st.st_uid != os.geteuid():
        return f"another user's file (uid {st.st_uid})"
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} hard links"
    return None


def open_input(path):
    """(fd, stat) of `path`, opened read-only, checked; raises Refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("a symbolic link; not followed") from None
        raise Refused(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        why = _why(st)
    except OSError as e:
        os.close(fd)
        raise Refused(e.strerror or str(e)) from None
    if why:
        os.close(fd)
        raise Refused(why)
    return fd, st


def read_all(fd, limit):
    """Up to `limit` bytes of the open file, and whether there was more."""
    chunks, got = [], 0
    while got <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def write_output(path, data, mode=0o600):
    """Writes `data` to `path`: a new file under an unpredictable name beside it, renamed over
    `path` when nothing or a file of ours stands there; raises Refused."""
    path = os.fspath(path)
    directory, base = os.path.split(path)
    temp = os.path.join(directory, f".{base}.tmp.{secrets.token_hex(8)}")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        raise Refused(e.strerror or str(e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            why = "a symbolic link; not followed" if stat.S_ISLNK(st.st_mode) else _why(st)
            if why:
                raise Refused(why)
        os.replace(temp, path)
    except OSError as e:
        _unlink(temp)
        raise Refused(e.strerror or str(e)) from None
    except Refused:
        _unlink(temp)
        raise


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
