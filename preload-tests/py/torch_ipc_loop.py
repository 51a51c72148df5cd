"""A torch.multiprocessing producer loop (Note [Segments of their own] in src/device/pool/mod.rs):
each step shares a fresh 1 MiB CUDA tensor with a spawned consumer, which reads it and drops it;
the producer frees it and empties its cache; every 9th step it keeps a 1 MiB tensor of its own.
argv[1]: steps. Prints one JSON line: the steps done, the driver's free memory at the end, and the
error if one ended the loop."""
import json
import sys

import torch
import torch.multiprocessing as mp

MIB = 1 << 20


def consumer(q, ack):
    torch.cuda.init()
    while True:
        t = q.get(timeout=120)
        if t is None:
            break
        value = int(t[:4].cpu().view(torch.int32)[0])
        del t
        ack.put(value)


if __name__ == "__main__":
    steps = int(sys.argv[1])
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(q, ack))
    child.start()
    keep, done, error = [], 0, None
    try:
        for i in range(steps):
            b = torch.empty(MIB, dtype=torch.uint8, device="cuda")
            b[:4].copy_(torch.tensor([i], dtype=torch.int32).view(torch.uint8))
            q.put(b)
            assert ack.get(timeout=60) == i
            del b
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
            if i % 9 == 0:
                keep.append(torch.empty(MIB, dtype=torch.uint8, device="cuda"))
            done = i + 1
    except torch.cuda.OutOfMemoryError as e:
        error = str(e).splitlines()[0][:200]
    q.put(None)
    child.join(60)
    free, _ = torch.cuda.mem_get_info()
    print(json.dumps({"steps": done, "free_mib": free >> 20, "error": error}))
