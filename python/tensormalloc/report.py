"""`tensormalloc report FILE... [--json]`: the JSON stats of a run's processes (one file each:
TENSORMALLOC_STATS=json:stats.%p.json, or PATH and PATH.PID beside it) side by side, one row per
process, and a total that means something: requests, hits and frees summed; live and cached
bytes summed as they were at the end; peaks are each process's own and are not added (a total
of peaks reached at different moments would be no process's figure). A file that is not a
tensormalloc stats file is refused with one line and left out."""
import json
import sys

COLUMNS = ("pid", "command", "parent", "requests", "hits", "frees", "live", "peak", "cached", "cuda reserved", "cuda live")


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def load(path):
    """The stats in `path`, or a one-line reason it was refused."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"{path}: not readable as JSON stats ({e.__class__.__name__}: {e})"
    if not isinstance(data, dict) or not isinstance(data.get("host"), dict) or "pid" not in data or "version" not in data:
        return None, f"{path}: not a tensormalloc stats file (no version, pid or host)"
    return data, None


def row(data):
    """One process's figures."""
    host = data["host"]
    cuda = data.get("cuda") or []
    parent = data.get("forked_from") or data.get("ppid")
    return {
        "pid": data["pid"],
        "command": data.get("command", ""),
        "parent": parent,
        "forked": data.get("forked_from") is not None,
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
        "cuda": {d: {k: sum(r["cuda"].get(d, {}).get(k, 0) for r in rows) for k in ("reserved_bytes", "live_bytes")} for d in devices},
    }


def text(rows, tot):
    head = f"{'pid':>8} {'command':<16} {'parent':>8} {'requests':>9} {'hits':>9} {'frees':>9} {'live':>12} {'peak':>12} {'cached':>12}  cuda (reserved/live)"
    lines = [head]
    for r in sorted(rows, key=lambda r: r["pid"]):
        cuda = " ".join(f"{d}: {_mib(v['reserved_bytes'])}/{_mib(v['live_bytes'])}" for d, v in sorted(r["cuda"].items()))
        parent = f"{r['parent']}{'f' if r['forked'] else ''}" if r["parent"] else "-"
        lines.append(f"{r['pid']:>8} {r['command'][:16]:<16} {parent:>8} {r['requests']:>9} {r['hits']:>9} {r['frees']:>9} "
                     f"{_mib(r['live_bytes']):>12} {_mib(r['peak_live_bytes']):>12} {_mib(r['cached_bytes']):>12}  {cuda}")
    cuda = " ".join(f"{d}: {_mib(v['reserved_bytes'])}/{_mib(v['live_bytes'])}" for d, v in sorted(tot["cuda"].items()))
    lines.append(f"{'total':>8} {str(tot['processes']) + ' processes':<16} {'':>8} {tot['requests']:>9} {tot['hits']:>9} {tot['frees']:>9} "
                 f"{_mib(tot['live_bytes']):>12} {'(own)':>12} {_mib(tot['cached_bytes']):>12}  {cuda}")
    lines.append("live and cached: each process's at the end of its file, summed; peak: each process's own "
                 "(peaks reached at different moments do not add); parent: Nf = forked from N (its numbers start at the fork)")
    return "\n".join(lines)


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print("usage: tensormalloc report STATS.json... [--json]", file=sys.stderr)
        return 2
    rows, refused = [], 0
    for p in paths:
        data, why = load(p)
        if why:
            print(f"tensormalloc report: {why}", file=sys.stderr)
            refused += 1
            continue
        rows.append(row(data))
    tot = total(rows)
    if as_json:
        print(json.dumps({"processes": rows, "total": tot}, indent=1))
    else:
        print(text(rows, tot))
    return 1 if refused else 0
