"""torch.cuda's memory calls at the edges of CUDA's life, with PyTorch's allocator ("plain") or
after tensormalloc.torch.enable() ("hooks"): empty_cache and memory_summary before CUDA has
started, and empty_cache in a child forked after it started (a DataLoader worker's case). Prints
one JSON line of what each did; the test compares the two modes."""
import json
import os
import sys

import torch

if sys.argv[1] == "hooks":
    import tensormalloc.torch
    tensormalloc.torch.enable()


def attempt(call):
    try:
        call()
        return "ok"
    except BaseException as e:  # noqa: BLE001 - the kind of failure is the answer
        return type(e).__name__


seen = {}
seen["empty_cache_before"] = attempt(torch.cuda.empty_cache)
seen["started_by_empty_cache"] = torch.cuda.is_initialized()
seen["summary_before"] = attempt(torch.cuda.memory_summary)
x = torch.arange(1 << 20, dtype=torch.float32).to("cuda")  # a copy: the stand-in runs no kernel
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, attempt(torch.cuda.empty_cache).encode())
    os._exit(0)
os.close(write)
seen["empty_cache_in_forked_child"] = os.read(read, 100).decode()
os.waitpid(pid, 0)
seen["sum"] = float(x.cpu().sum().item())
print(json.dumps(seen, sort_keys=True))
