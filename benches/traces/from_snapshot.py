#!/usr/bin/env python3
"""Turns a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot: a pickle whose
`device_traces` hold alloc / free_completed events with addresses and sizes) into the replay
format of benches/pool_replay.rs: one operation per line, `a ID SIZE` or `f ID`, for one device.

A snapshot records one stretch of a run: blocks live before it (weights, optimizer state) are
freed in it without an alloc, or still live at the dump without one. They come first as allocs
(in address order), the recorded events follow, and every block still live at the end is freed,
so the sequence can be replayed as a repeating step. Loads the pickle without torch.

    benches/traces/from_snapshot.py SNAPSHOT.pickle [DEVICE] > NAME.ops
"""
import pickle
import sys


class Loose(pickle.Unpickler):
    """Any class the pickle names becomes a plain dict: no torch needed."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception:
            class Stub(dict):
                def __init__(self, *a, **k):
                    pass

                def __setstate__(self, state):
                    if isinstance(state, dict):
                        self.update(state)
            return Stub


def main():
    path, device = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    with open(path, "rb") as f:
        snap = Loose(f).load()
    events = snap["device_traces"][device]
    # Blocks live before the recording: freed without an alloc, or active at the dump.
    allocated, before = set(), {}
    for e in events:
        if e["action"] == "alloc":
            allocated.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in allocated:
            before.setdefault(e["addr"], e["size"])
    for seg in snap.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated" and b["address"] not in allocated:
                before.setdefault(b["address"], b["size"])
    ids, next_id, out = {}, 0, []

    def alloc(addr, size):
        nonlocal next_id
        next_id += 1
        ids[addr] = next_id
        out.append(f"a {next_id} {size}")

    for addr in sorted(before):
        alloc(addr, before[addr])
    for e in events:
        if e["action"] == "alloc":
            alloc(e["addr"], e["size"])
        elif e["action"] == "free_completed" and e["addr"] in ids:
            out.append(f"f {ids.pop(e['addr'])}")
    for addr in sorted(ids):
        out.append(f"f {ids[addr]}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
