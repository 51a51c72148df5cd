"""PyTorch CPU workloads for bench-numpy/torch_cpu.py, run in this process under whatever
allocator the runner preloaded. Two threads, seeded, no dropout.

    torch_workloads.py NAME STEPS   warm up, time STEPS steps, idle 3 s; print one JSON line
    torch_workloads.py NAME serve   warm up, print "ready", then answer the runner's commands on
                                    stdin, one JSON line each: "steps K" runs K steps (wall and
                                    CPU ms, minor faults and loss of each), "idle S" sleeps S
                                    seconds and reports memory, "quit" ends.

Losses are float.hex() strings so the runner can check they are identical under every allocator.
Memory: peak RSS (VmHWM), and RSS, anonymous memory and LazyFree from smaps_rollup, at the end
and once torch is loaded, before the workload is built (so the memory the workload and the
allocator account for can be told from the ~400 MB torch's libraries hold anyway)."""
import json
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WARMUP = 3
IDLE_S = 3.0


def memory_mb():
    """RSS, anonymous memory and LazyFree (pages MADV_FREE'd, which the kernel takes back at no
    cost) of this process in MB, from /proc/self/smaps_rollup, and the peak RSS."""
    out = {"Rss": 0, "Anonymous": 0, "LazyFree": 0}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in out:
                out[key] = int(rest.split()[0])
    return {"rss_mb": out["Rss"] / 1024, "anon_mb": out["Anonymous"] / 1024, "lazyfree_mb": out["LazyFree"] / 1024,
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb():
    """VmHWM: ru_maxrss would carry the runner's peak across fork and exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Mlp:
    """MLP + Adam: batch 1024, widths 256-1024: activations of 4 MiB and 1 MiB, weights and
    optimizer states of 1 MiB and 256 KiB."""

    def __init__(self):
        self.model = nn.Sequential(
            nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(),
            nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 64))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(11)
        self.x = torch.randn(1024, 256, generator=g)
        self.y = torch.randn(1024, 64, generator=g)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return loss.item()


class Transformer:
    """A small language model + AdamW: vocab 8192, d_model 128, 2 layers, batch 8 x 128 tokens:
    logits of 32 MiB, attention scores of 2 MiB, embedding and head of 4 MiB, activations of
    512 KiB-2 MiB, weights of 64-256 KiB."""

    def __init__(self):
        vocab, d = 8192, 128
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 512, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        params = [*self.emb.parameters(), *self.enc.parameters(), *self.head.parameters()]
        self.opt = torch.optim.AdamW(params, lr=1e-4)
        g = torch.Generator().manual_seed(12)
        self.tokens = torch.randint(0, vocab, (8, 129), generator=g)
        self.mask = nn.Transformer.generate_square_subsequent_mask(128)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        inp, target = self.tokens[:, :-1], self.tokens[:, 1:]
        logits = self.head(self.enc(self.emb(inp), mask=self.mask, is_causal=True))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        self.opt.step()
        return loss.item()


class ConvNet:
    """Inference of a small conv-net, batch 32 of 3x96x96: activations from 38 MB (32 channels
    at 96x96) down to 64 KiB."""

    def __init__(self):
        def block(cin, cout, stride):
            return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        self.model = nn.Sequential(
            *block(3, 32, 1), *block(32, 32, 2), *block(32, 64, 2), *block(64, 128, 2),
            *block(128, 256, 2), *block(256, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100)).eval()
        g = torch.Generator().manual_seed(13)
        self.x = torch.randn(32, 3, 96, 96, generator=g)

    def step(self):
        with torch.no_grad():
            return self.model(self.x).float().abs().sum().item()


class Images(torch.utils.data.Dataset):
    """512 deterministic 3x64x64 samples (48 KiB each), made in the workers."""

    def __len__(self):
        return 512

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randn(3, 64, 64, generator=g), i % 10


class Loader:
    """One epoch per step over a DataLoader with 2 forked workers (not persistent: every step
    forks them again, with the parent's blocks live and cached), batches of 64 (3 MiB), each
    through a small classifier trained with SGD in the parent."""

    def __init__(self):
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.loader = torch.utils.data.DataLoader(
            Images(), batch_size=64, num_workers=2, multiprocessing_context="fork", persistent_workers=False)

    def step(self):
        total = 0.0
        for x, y in self.loader:
            self.opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            total += loss.item()
        return total


WORKLOADS = {"mlp": Mlp, "transformer": Transformer, "convnet": ConvNet, "dataloader": Loader}


def cpu_s():
    """CPU seconds of this process (every thread) and of its reaped children (the workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed_step(work):
    """One step: (wall ms, CPU ms, minor faults, loss as float.hex)."""
    f, t, c = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter(), cpu_s()
    loss = work.step()
    wall, cpu = (time.perf_counter() - t) * 1e3, (cpu_s() - c) * 1e3
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f, float(loss).hex()


def serve(work, base):
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "steps":
            steps = [timed_step(work) for _ in range(int(arg))]
            out = {k: [s[i] for s in steps] for i, k in enumerate(("wall_ms", "cpu_ms", "faults", "losses"))}
        elif cmd == "idle":
            time.sleep(float(arg))
            out = {**memory_mb(), "base_anon_mb": base["anon_mb"], "base_lazyfree_mb": base["lazyfree_mb"]}
        else:
            return
        print(json.dumps(out), flush=True)


def main():
    name, steps = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    torch.set_num_threads(2)
    base = memory_mb()  # torch and its libraries loaded, nothing of the workload yet
    work = WORKLOADS[name]()
    losses = [float(work.step()).hex() for _ in range(WARMUP)]
    if steps == "serve":
        return serve(work, base)
    runs = [timed_step(work) for _ in range(int(steps))]
    time.sleep(IDLE_S)  # the model and optimizer stay; the step's temporaries are gone
    print(json.dumps({
        "wall_ms": [r[0] for r in runs], "cpu_ms": [r[1] for r in runs],
        "faults": sum(r[2] for r in runs) / len(runs), "losses": losses + [r[3] for r in runs], **memory_mb(),
        "base_anon_mb": base["anon_mb"], "base_lazyfree_mb": base["lazyfree_mb"],
    }))


if __name__ == "__main__":
    main()
