"""`tensormalloc report FILE... [--json]`: the stats of a run's processes (one file each:
TENSORMALLOC_STATS=json:stats.%p.json, or PATH and PATH.PID beside it) side by side, one row per
process, and a total that means something: requests, hits and frees summed; live and cached
bytes summed as they were at the end; peaks are each process's own and are not added (a total
of peaks reached at different moments would be no process's figure).

A file is the JSON a process wrote at its exit, or, for one that is still running or ended
without its exit hook (SIGKILL, SIGTERM, os._exit, exec), its mapped counters (src/record/ledger/,
Note [Numbers that survive]): their counts are exact to the last event; the rest of the report
(cached bytes, phases, holders) is as of its last second. Each row says which: `ended` is exit,
running, killed or exec, and `complete` is true only for exit.

Every file is checked before it counts: opened without blocking or following a link, a regular
file of ours (src/sys/files.rs's rules); JSON strict (no NaN or Infinity), every number a whole
number not below zero, the fields used of the right types, a version this reader knows; one
process (pid, start, image) and one file counted once. A file that fails is refused with one
line and the others are still reported; `--json` always prints strict JSON."""
import fcntl
import json
import os
import struct
import sys

from ._files import Refused, open_input, read_all

COLUMNS = ("pid", "command", "parent", "requests", "hits", "frees", "live", "peak", "cached", "ended", "cuda reserved", "cuda live")
VERSIONS = (1, 2, 3)  # of the JSON (tm_stats_t's version; 3 added no JSON field)
MAX_BYTES = 16 << 20

# src/record/ledger/layout.rs's layout (little-endian).
LEDGER_MAGIC = b"TMLEDGER"
LEDGER_VERSION = 1
HEADER = struct.Struct("<8s12I4Q16s8I8Q5Q")
HEADER_FIELDS = ("magic", "version", "file_bytes", "places_at", "places", "place_bytes", "detail_at", "detail_bytes", "pid",
                 "ppid", "uid", "forked_from", "ancestors", "ticks_per_second", "start_ticks", "image_started_wall_ns",
                 "process_started_wall_ns", "command")
PLACE = struct.Struct("<16Q")
PLACE_FIELDS = ("hits", "misses", "grows", "failures", "frees", "live_bytes", "peak_live_bytes", "handed_out_bytes",
                "live_blocks", "segments_mapped", "segments_released", "reserved_bytes", "peak_reserved_bytes")
DETAIL_SEQ_AT = 208


# How a process's file may say it ended, and a device's figures the report sums.
ENDINGS = ("exit", "running", "killed", "exec")
CUDA_COUNTS = ("requests", "hits", "reserved_bytes", "live_bytes", "peak_reserved_bytes")


class Bad(Exception):
    """A file refused, and why."""


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def _reject_constant(name):
    raise Bad(f"holds {name}, which is not JSON")


def _count(v, where):
    if type(v) is not int or not 0 <= v < 1 << 64:
        raise Bad(f"{where} is {json.dumps(v)[:40]}, not a count")
    return v


def _check_numbers(v, where="the file"):
    """Every number in `v` a whole number not below zero (the library writes no other)."""
    if isinstance(v, dict):
        for k, x in v.items():
            _check_numbers(x, f"{where}.{k}" if where != "the file" else k)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_numbers(x, f"{where}[{i}]")
    elif isinstance(v, bool) or v is None or isinstance(v, str):
        return
    elif isinstance(v, int):
        _count(v, where)
    else:
        raise Bad(f"{where} is {v!r}, not a count")


def check_stats(data):
    """Raises Bad unless `data` is a tensormalloc stats JSON this reader can sum."""
    if not isinstance(data, dict):
        raise Bad("not a tensormalloc stats file (not a JSON object)")
    if "version" not in data or "pid" not in data or not isinstance(data.get("host"), dict):
        raise Bad("not a tensormalloc stats file (no version, pid or host)")
    if type(data["version"]) is not int or data["version"] not in VERSIONS:
        raise Bad(f"version {json.dumps(data['version'])[:20]}, which this reader does not know (it reads {', '.join(map(str, VERSIONS))})")
    _check_numbers(data)
    if _count(data["pid"], "pid") == 0:
        raise Bad("pid is 0")
    for key in ("ppid", "started_ns", "process_start_ticks"):
        if key in data:
            _count(data[key], key)
    if data.get("forked_from") is not None:
        _count(data["forked_from"], "forked_from")
    if not isinstance(data.get("command", ""), str):
        raise Bad("command is not text")
    if data.get("ended", "exit") not in ENDINGS:
        raise Bad(f"ended is {json.dumps(data['ended'])[:40]}, not one of {', '.join(ENDINGS)}")
    for key in ("requests", "hits", "frees", "live_bytes", "peak_live_bytes", "cached_bytes"):
        if key in data["host"]:
            _count(data["host"][key], f"host.{key}")
    cuda = data.get("cuda", [])
    if not isinstance(cuda, list) or not all(isinstance(d, dict) and type(d.get("device")) is int and 0 <= d["device"] < 64 for d in cuda):
        raise Bad("cuda is not a list of devices")
    if len({d["device"] for d in cuda}) != len(cuda):
        raise Bad("cuda names a device twice")
    for d in cuda:
        for key in CUDA_COUNTS:
            if key in d:
                _count(d[key], f"cuda[{d['device']}].{key}")


def _alive(pid, start_ticks):
    """Whether process `pid` that started at `start_ticks` (/proc/PID/stat field 22) lives."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return False
    fields = line[line.rfind(b")") + 2:].split()
    # fields[0] is the state (field 3): a zombie or a dead process does not run.
    return len(fields) > 19 and fields[0] not in (b"Z", b"X", b"x") and fields[19] == str(start_ticks).encode()


def _ended(fd, header):
    """exit, running, killed or exec, for a counters file (its writer holds a lock while it runs;
    the image after an exec marks the one before)."""
    if header["exited"]:
        return "exit"
    if header["replaced_wall_ns"]:
        return "exec"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "running"
    except OSError:
        return "killed"
    fcntl.flock(fd, fcntl.LOCK_UN)
    return "exec" if _alive(header["pid"], header["start_ticks"]) else "killed"


def read_ledger(data, fd):
    """The stats JSON a counters file stands for: its detail (the report as of its last second)
    with every count the counters keep put in, exact; raises Bad."""
    if len(data) < HEADER.size:
        raise Bad("cut short (shorter than its header)")
    h = dict(zip(HEADER_FIELDS, HEADER.unpack_from(data)))
    values = HEADER.unpack_from(data)
    h["ancestor_pids"] = values[18:26]
    h["ancestor_starts"] = values[26:34]
    h["exited"], h["detail_seq"], h["detail_len"], h["detail_wall_ns"], h["replaced_wall_ns"] = values[34:39]
    if h["version"] != LEDGER_VERSION:
        raise Bad(f"counters of version {h['version']}, which this reader does not know (it reads {LEDGER_VERSION})")
    if len(data) < h["file_bytes"] or not (0 < h["places"] <= 64 and h["place_bytes"] >= 104
                                           and h["places_at"] >= HEADER.size
                                           and h["places_at"] + h["places"] * h["place_bytes"] <= h["detail_at"]
                                           and h["detail_at"] + h["detail_bytes"] <= h["file_bytes"]
                                           and h["detail_len"] <= h["detail_bytes"]):
        raise Bad("damaged counters (sizes that do not fit the file)")
    if h["pid"] == 0:
        raise Bad("damaged counters (pid 0)")
    places = []
    for i in range(h["places"]):
        raw = PLACE.unpack_from(data, h["places_at"] + i * h["place_bytes"])
        p = dict(zip(PLACE_FIELDS, raw))
        for level in ("live_bytes", "reserved_bytes", "live_blocks"):
            if p[level] >= 1 << 63:  # a level below zero only in transit
                p[level] = 0
        places.append(p)
    detail, as_of = {}, None
    if h["detail_len"] and h["detail_seq"] % 2 == 0:
        # The writer rewrites it under a sequence number (odd while it writes): read again.
        seq_now = struct.unpack("<Q", os.pread(fd, 8, DETAIL_SEQ_AT))[0]
        if seq_now == h["detail_seq"]:
            text = data[h["detail_at"]:h["detail_at"] + h["detail_len"]]
            try:
                detail = json.loads(text, parse_constant=_reject_constant)
                check_stats(detail)
                as_of = h["detail_wall_ns"]
            except (ValueError, Bad):
                detail = {}
    stats = dict(detail)
    command = h["command"].split(b"\0", 1)[0].decode("utf-8", "replace")
    stats.update({"version": stats.get("version", 2), "pid": h["pid"], "ppid": h["ppid"], "command": command,
                  "forked_from": h["forked_from"] or None, "started_ns": h["image_started_wall_ns"],
                  "process_start_ticks": h["start_ticks"], "complete": bool(h["exited"]), "ended": _ended(fd, h),
                  "detail_as_of_ns": as_of})
    host = dict(stats.get("host") or {})
    hp = places[0]
    host.update({"requests": hp["hits"] + hp["misses"] + hp["grows"] + hp["failures"], "hits": hp["hits"], "grows": hp["grows"],
                 "misses": hp["misses"], "frees": hp["frees"], "live_bytes": hp["live_bytes"],
                 "peak_live_bytes": hp["peak_live_bytes"], "handed_out_bytes": hp["handed_out_bytes"]})
    stats["host"] = host
    if len(places) > 1:
        pp = places[1]
        pinned = dict(stats.get("pinned") or {})
        pinned.update({"requests": pp["hits"] + pp["misses"] + pp["failures"], "hits": pp["hits"]})
        stats["pinned"] = pinned
    devices = {d["device"]: dict(d) for d in stats.get("cuda") or []}
    for device, p in enumerate(places[2:]):
        if not any(p.values()) and device not in devices:
            continue
        d = devices.setdefault(device, {"device": device})
        d.update({"requests": p["hits"] + p["misses"] + p["failures"], "hits": p["hits"], "oom_failures": p["failures"],
                  "live_bytes": p["live_bytes"], "peak_live_bytes": p["peak_live_bytes"],
                  "segments_mapped": p["segments_mapped"], "segments_released": p["segments_released"],
                  "reserved_bytes": p["reserved_bytes"], "peak_reserved_bytes": p["peak_reserved_bytes"]})
    stats["cuda"] = [devices[d] for d in sorted(devices)]
    check_stats(stats)
    return stats


def load(path):
    """(stats, (st_dev, st_ino)), or (None, a one-line reason it was refused)."""
    try:
        fd, st = open_input(path)
    except Refused as e:
        return None, f"{path}: {e}"
    try:
        data, more = read_all(fd, MAX_BYTES)
        if more:
            raise Bad(f"larger than {MAX_BYTES >> 20} MiB: not a tensormalloc stats file")
        if data.startswith(LEDGER_MAGIC):
            stats = read_ledger(data, fd)
        else:
            try:
                stats = json.loads(data, parse_constant=_reject_constant)
            except (ValueError, RecursionError) as e:
                raise Bad(f"not readable as JSON stats ({e.__class__.__name__}: {str(e)[:80]})") from None
            check_stats(stats)
            stats.setdefault("complete", True)
            stats.setdefault("ended", "exit")
        return stats, (st.st_dev, st.st_ino)
    except Bad as e:
        return None, f"{path}: {e}"
    except OSError as e:
        return None, f"{path}: {e.strerror or e}"
    finally:
        os.close(fd)


def row(data, path=None):
    """One process's figures."""
    host = data["host"]
    cuda = data.get("cuda") or []
    parent = data.get("forked_from") or data.get("ppid")
    return {
        "pid": data["pid"],
        "command": data.get("command", ""),
        "parent": parent,
        "forked": data.get("forked_from") is not None,
        "file": path,
        "complete": bool(data.get("complete", True)),
        "ended": data.get("ended", "exit"),
        "requests": host.get("requests", 0) + sum(d.get("requests", 0) for d in cuda),
        "hits": host.get("hits", 0) + sum(d.get("hits", 0) for d in cuda),
        "frees": host.get("frees", 0),
        "live_bytes": host.get("live_bytes", 0),
        "peak_live_bytes": host.get("peak_live_bytes", 0),
        "cached_bytes": host.get("cached_bytes", 0),
        "cuda": {d["device"]: {"reserved_bytes": d.get("reserved_bytes", 0), "live_bytes": d.get("live_bytes", 0),
                               "peak_reserved_bytes": d.get("peak_reserved_bytes", 0)} for d in cuda},
    }


def total(rows):
    """Sums that mean something; peaks are left per process."""
    devices = sorted({d for r in rows for d in r["cuda"]})
    return {
        "processes": len(rows),
        "requests": sum(r["requests"] for r in rows),
        "hits": sum(r["hits"] for r in rows),
        "frees": sum(r["frees"] for r in rows),
        "live_bytes": sum(r["live_bytes"] for r in rows),
        "cached_bytes": sum(r["cached_bytes"] for r in rows),
        "largest_peak_live_bytes": max((r["peak_live_bytes"] for r in rows), default=0),
        "complete": all(r["complete"] for r in rows),
        "cuda": {d: {k: sum(r["cuda"].get(d, {}).get(k, 0) for r in rows) for k in ("reserved_bytes", "live_bytes")} for d in devices},
    }


def text(rows, tot):
    head = (f"{'pid':>8} {'command':<16} {'parent':>8} {'requests':>9} {'hits':>9} {'frees':>9} {'live':>12} {'peak':>12} "
            f"{'cached':>12} {'ended':>8}  cuda (reserved/live)")
    lines = [head]
    for r in sorted(rows, key=lambda r: (r["pid"], r["ended"] != "exec")):
        cuda = " ".join(f"{d}: {_mib(v['reserved_bytes'])}/{_mib(v['live_bytes'])}" for d, v in sorted(r["cuda"].items()))
        parent = f"{r['parent']}{'f' if r['forked'] else ''}" if r["parent"] else "-"
        lines.append(f"{r['pid']:>8} {r['command'][:16]:<16} {parent:>8} {r['requests']:>9} {r['hits']:>9} {r['frees']:>9} "
                     f"{_mib(r['live_bytes']):>12} {_mib(r['peak_live_bytes']):>12} {_mib(r['cached_bytes']):>12} {r['ended']:>8}  {cuda}")
    cuda = " ".join(f"{d}: {_mib(v['reserved_bytes'])}/{_mib(v['live_bytes'])}" for d, v in sorted(tot["cuda"].items()))
    lines.append(f"{'total':>8} {str(tot['processes']) + (' process' if tot['processes'] == 1 else ' processes'):<16} {'':>8} {tot['requests']:>9} {tot['hits']:>9} {tot['frees']:>9} "
                 f"{_mib(tot['live_bytes']):>12} {'(own)':>12} {_mib(tot['cached_bytes']):>12} {'':>8}  {cuda}")
    lines.append("live and cached: each process's at the end of its file, summed; peak: each process's own "
                 "(peaks reached at different moments do not add); parent: Nf = forked from N (its numbers start at the fork); "
                 "ended: exit (its report is whole), running, killed (no exit hook ran: SIGKILL, SIGTERM, os._exit) or exec "
                 "(its image replaced): counts exact to the last event, cached bytes as of its last second")
    return "\n".join(lines)


def process_key(stats):
    """What names one image of one process: its pid, its process's start, its image's start."""
    return stats["pid"], stats.get("process_start_ticks"), stats.get("started_ns")


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print("usage: tensormalloc report STATS.json... [--json]", file=sys.stderr)
        return 2
    rows, refused = [], 0
    files, processes = {}, {}
    for p in paths:
        stats, info = load(p)
        if stats is None:
            print(f"tensormalloc report: {info}", file=sys.stderr)
            refused += 1
            continue
        file_key = info
        if file_key in files:
            print(f"tensormalloc report: {p}: the same file as {files[file_key]}; counted once", file=sys.stderr)
            refused += 1
            continue
        key = process_key(stats)
        if key in processes:
            print(f"tensormalloc report: {p}: process {stats['pid']}'s numbers again (as in {processes[key]}); counted once",
                  file=sys.stderr)
            refused += 1
            continue
        files[file_key], processes[key] = p, p
        r = row(stats, p)
        r["stats"] = stats
        rows.append(r)
    tot = total(rows)
    if as_json:
        print(json.dumps({"processes": rows, "total": tot}, indent=1, allow_nan=False))
    else:
        print(text([{k: v for k, v in r.items() if k != "stats"} for r in rows], tot))
    return 1 if refused else 0
