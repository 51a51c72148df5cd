"""PyTorch meets a failed cudaMalloc by freeing its own cache and asking again (Note [A report
the program recovers from] in src/report/oom.rs). argv[1] "recovers": 600 MiB freed into
PyTorch's cache, then 700 MiB asked: the retry succeeds. "fails": 300 MiB live, then 900 MiB
asked: the retry fails too, OutOfMemoryError. Prints the outcome and PyTorch's retry and OOM
counts."""
import sys

import torch

MIB = 1 << 20
if sys.argv[1] == "recovers":
    a = torch.empty(300 * MIB, dtype=torch.uint8, device="cuda")
    b = torch.empty(300 * MIB, dtype=torch.uint8, device="cuda")
    del a, b
    c = torch.empty(700 * MIB, dtype=torch.uint8, device="cuda")
    outcome = "served"
else:
    a = torch.empty(300 * MIB, dtype=torch.uint8, device="cuda")
    try:
        c = torch.empty(900 * MIB, dtype=torch.uint8, device="cuda")
        outcome = "served"
    except torch.cuda.OutOfMemoryError:
        outcome = "OutOfMemoryError"
s = torch.cuda.memory_stats()
print(outcome, s["num_alloc_retries"], s["num_ooms"])
