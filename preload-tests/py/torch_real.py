"""Real PyTorch's CUDA memory, checked as its users use it, in one process per mode; prints JSON:
{"mode", "loaded_by", "device", "checks": {name: {"ok": bool, "detail": str}}}. The same script
runs over the stand-in driver (preload-tests/test_torch_real.py, beside the driver alone) and on
a real GPU (scripts/gpu-check). Modes (the environment carries PyTorch's and tensormalloc's
settings; this script only calls enable()):
  cache             PyTorch's caching allocator (under the preload: over tensormalloc's pool)
  no_caching        PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor a cudaMalloc
  hooks             tensormalloc.torch.enable(): the pool is PyTorch's allocator
  torch_expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  tm_expandable     TENSORMALLOC_CUDA_SEGMENTS=expandable under the preload
Each check asserts what PyTorch does alone (and, for hooks, what PyTorch's own allocator does
where the pluggable one cannot): a failing check names what it saw. No kernel runs (the stand-in
has none): data moves by copies only. `child` is the IPC consumer (spawned by torch.multiprocessing)."""
import json
import os
import queue as queue_module
import sys
import traceback

import torch
import torch.multiprocessing as mp

KIB, MIB = 1 << 10, 1 << 20
IPC_SIZES = [4 * KIB, 64 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
IPC_WAIT_S = float(os.environ.get("TORCH_REAL_IPC_WAIT_S", "120"))


def pattern(nbytes, salt=0):
    """int32 values that differ per tensor (salt) and per element, made on the CPU."""
    n = nbytes // 4
    return (torch.arange(n, dtype=torch.int32) * 7 + salt) % 251


def ipc_child(q, answers):
    torch.cuda.init()
    seen = []
    while True:
        try:
            item = q.get(timeout=IPC_WAIT_S)
        except queue_module.Empty:
            seen.append(("timeout", False))
            break
        if item is None:
            break
        salt, nbytes, t = item
        ok = t.is_cuda and t.numel() * 4 == nbytes and torch.equal(t.cpu(), pattern(nbytes, salt))
        seen.append((nbytes, bool(ok)))
        del t
    answers.put(seen)


class Checks:
    def __init__(self, mode):
        self.mode = mode
        self.results = {}
        self.hooks = mode == "hooks"
        self.pytorch_cache = mode in ("cache", "torch_expandable", "tm_expandable")  # PyTorch's allocator keeps blocks
        import tensormalloc
        self.tensormalloc = tensormalloc
        self.preloaded = tensormalloc.loaded_by() == "preload"

    def run(self, name, fn):
        try:
            detail = fn()
            self.results[name] = {"ok": True, "detail": detail or ""}
        except Exception as e:  # noqa: BLE001 - every failure is reported, the next check still runs
            self.results[name] = {"ok": False, "detail": traceback.format_exception_only(type(e), e)[-1].strip()[:2000]}

    # --- the checks ---

    def devices(self):
        assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
        n = torch.cuda.device_count()
        assert n >= 1, n
        want = os.environ.get("FAKECUDA_DEVICES", "2") if os.environ.get("TORCH_REAL_STANDIN") else None
        assert want is None or n == int(want), f"{n} devices, the stand-in has {want}"
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total, (free, total)
        return f"{n} x {torch.cuda.get_device_name(0)}, {total >> 20} MiB"

    def copies(self):
        out = []
        for nbytes in (KIB, MIB, 64 * MIB):
            src = pattern(nbytes, 3)
            d = src.to("cuda")
            assert d.data_ptr() != 0, "a tensor at address 0"
            assert torch.equal(d.cpu(), src), f"host -> device -> host of {nbytes} bytes"
            c = d.clone()
            assert c.data_ptr() != d.data_ptr() and torch.equal(c.cpu(), src), f"device -> device of {nbytes} bytes"
            if torch.cuda.device_count() > 1:
                other = d.to("cuda:1")
                assert torch.equal(other.cpu(), src), f"device 0 -> device 1 of {nbytes} bytes"
                out.append("peer")
        return " ".join(out)

    def reuse(self):
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        first = x.data_ptr()
        del x
        y = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        same = y.data_ptr() == first
        # PyTorch's cache, or the pool under it, hands the freed block out again; a cudaMalloc
        # after a cudaFree with nothing caching between (no_caching alone) may or may not.
        if self.mode != "no_caching" or self.preloaded:
            assert same, f"{hex(first)} freed, then {hex(y.data_ptr())}"
        return f"same address: {same}"

    def stats(self):
        alloc = self.tensormalloc.torch.memory_allocated if self.hooks else torch.cuda.memory_allocated
        before = torch.cuda.memory_allocated()
        blocks_before = torch.cuda.memory_stats().get("allocation.all.current", 0)
        x = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
        grew = torch.cuda.memory_allocated() - before
        stats = torch.cuda.memory_stats()
        reserved = torch.cuda.memory_reserved()
        if self.mode == "no_caching":
            # PyTorch keeps no figures when it does not cache (alone as under the preload).
            assert grew == 0 and reserved == 0, (grew, reserved)
        else:
            assert grew == 3 * MIB, f"memory_allocated() grew by {grew}"
            assert stats["allocation.all.current"] == blocks_before + 1, stats["allocation.all.current"]
            assert reserved >= torch.cuda.memory_allocated() >= 3 * MIB, reserved
            assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated()
            assert alloc() == torch.cuda.memory_allocated()
        if self.hooks:
            ours = self.tensormalloc.torch.memory_stats()
            assert ours["allocated_bytes.all.current"] == torch.cuda.memory_allocated(), ours
            assert self.tensormalloc.torch.memory_reserved() == reserved
        del x
        after = torch.cuda.memory_allocated()
        assert after == before, f"{after} after the free, {before} before"
        return f"allocated +{grew >> 20} MiB, reserved {reserved >> 20} MiB"

    def empty_cache(self):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free0, _ = torch.cuda.mem_get_info()
        x = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
        free1, _ = torch.cuda.mem_get_info()
        assert free1 <= free0 - 64 * MIB, f"free {free0 >> 20} -> {free1 >> 20} MiB with 64 MiB live"
        del x
        reserved_before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        reserved_after = torch.cuda.memory_reserved()
        free2, _ = torch.cuda.mem_get_info()
        if self.mode != "no_caching":
            assert reserved_after <= reserved_before - 64 * MIB, f"reserved {reserved_before >> 20} -> {reserved_after >> 20} MiB"
        assert free2 >= free0 - 2 * MIB, f"free {free0 >> 20} MiB before, {free2 >> 20} MiB after empty_cache"
        return f"free {free0 >> 20} -> {free1 >> 20} -> {free2 >> 20} MiB"

    def snapshot(self):
        x = torch.empty(5 * MIB, dtype=torch.uint8, device="cuda")
        snap = torch.cuda.memory._snapshot()
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == x.data_ptr()]
        if self.mode == "no_caching":
            assert not blocks, "PyTorch lists no block when it does not cache"
            return f"{len(snap['segments'])} segments"
        assert len(blocks) == 1 and blocks[0]["state"] == "active_allocated" and blocks[0]["size"] >= 5 * MIB, blocks
        if self.hooks:
            ours = self.tensormalloc.torch.snapshot()
            mine = [b for s in ours["segments"] for b in s["blocks"] if b["address"] == x.data_ptr()]
            assert mine and mine[0]["frames"] and mine[0]["frames"][0]["name"] == "torch", mine
        return f"{len(snap['segments'])} segments"

    def oom(self):
        free, total = torch.cuda.mem_get_info()
        expected = torch.AcceleratorError if self.mode == "no_caching" else torch.OutOfMemoryError
        # More than the device holds.
        try:
            t = torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
            raise AssertionError(f"a {(total >> 20) + 1024} MiB tensor on a {total >> 20} MiB device, at {hex(t.data_ptr())}")
        except expected as e:
            assert "out of memory" in str(e), str(e)[:200]
        # Until the device is full: each tensor real, the loop ends with the error.
        held, raised = [], None
        for _ in range(total // (64 * MIB) + 8):
            try:
                t = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
            except expected as e:
                raised = e
                break
            assert t.data_ptr() != 0, f"tensor {len(held)} at address 0"
            held.append(t)
        assert raised is not None, f"{len(held)} tensors of 64 MiB on a {total >> 20} MiB device and no error"
        assert "out of memory" in str(raised), str(raised)[:200]
        n = len(held)
        held.clear()
        torch.cuda.empty_cache()
        # The next allocation works, and holds what is copied in.
        src = pattern(256 * MIB, 5)
        d = src.to("cuda")
        assert torch.equal(d.cpu(), src), "a tensor after the out-of-memory error"
        return f"{n} x 64 MiB before {type(raised).__name__}"

    def pinned(self):
        src = pattern(4 * MIB, 9)
        h = torch.empty_like(src).pin_memory()
        assert h.is_pinned(), "pin_memory() gave memory PyTorch does not call pinned"
        h.copy_(src)
        d = h.to("cuda", non_blocking=True)
        back = torch.empty_like(src).pin_memory()
        back.copy_(d, non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(back, src), "pinned -> device -> pinned"
        return ""

    def streams(self):
        src = pattern(2 * MIB, 11)
        side = torch.cuda.Stream()
        done = torch.cuda.Event()
        with torch.cuda.stream(side):
            a = src.to("cuda", non_blocking=True)
            b = a.clone()
            done.record(side)
        torch.cuda.current_stream().wait_event(done)
        b.record_stream(torch.cuda.current_stream())
        c = b.clone()
        torch.cuda.synchronize()
        assert done.query(), "an event recorded before synchronize() is not complete"
        assert torch.equal(c.cpu(), src), "copies across streams"
        del a, b
        with torch.cuda.stream(side):
            e = torch.empty(2 * MIB, dtype=torch.uint8, device="cuda")
        side.synchronize()
        assert e.data_ptr() != 0
        return ""

    def ipc(self):
        ctx = mp.get_context("spawn")
        q, answers = ctx.Queue(), ctx.Queue()
        refused = []
        q._on_queue_feeder_error = lambda e, obj: refused.append(f"{type(e).__name__}: {e}")
        child = ctx.Process(target=ipc_child, args=(q, answers), daemon=True)
        child.start()
        keep = []
        try:
            for salt, nbytes in enumerate(IPC_SIZES):
                t = pattern(nbytes, salt).to("cuda")
                keep.append(t)
                q.put((salt, nbytes, t))
            q.put(None)
            try:
                seen = answers.get(timeout=IPC_WAIT_S * 2)
            except queue_module.Empty:
                seen = None
        finally:
            child.join(30)
            if child.is_alive():
                child.kill()
        assert isinstance(seen, list), f"the child answered nothing in {IPC_WAIT_S * 2:.0f} s; sending: {refused[:2]}"
        right = sorted(s[0] for s in seen if s[1])
        wrong = [s for s in seen if not s[1]]
        # What PyTorch itself cannot share, it refuses at the sender, the same with or without the
        # preload: tensors it does not cache (no_caching: it does not know their allocation), and
        # any pluggable allocator's (hooks: CUDAPluggableAllocator has no IPC).
        refusal = {"no_caching": "invalid device pointer", "hooks": "CUDAPluggableAllocator does not"}.get(self.mode)
        if refusal:
            assert not right and not wrong and len(refused) == len(IPC_SIZES) and all(refusal in r for r in refused), (
                f"PyTorch refuses these ({refusal!r}); the child read {right} right, {wrong} wrong; sending: {refused[:2]}")
            return f"refused by PyTorch: {refused[0][:120]}"
        assert right == IPC_SIZES and not wrong and not refused, (
            f"the child read {right} right, {wrong} wrong (of {IPC_SIZES}); sending: {refused[:2]}")
        return f"{len(right)} tensors, {IPC_SIZES[0]} to {IPC_SIZES[-1]} bytes"


ORDER = ["devices", "copies", "reuse", "stats", "empty_cache", "snapshot", "pinned", "streams", "ipc", "oom"]


def main():
    mode = sys.argv[1]
    if mode == "hooks":
        import tensormalloc.torch
        tensormalloc.torch.enable()
    checks = Checks(mode)
    for name in ORDER:
        checks.run(name, getattr(checks, name))
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(json.dumps({"mode": mode, "loaded_by": checks.tensormalloc.loaded_by(), "device": name, "checks": checks.results}))


if __name__ == "__main__":
    main()
