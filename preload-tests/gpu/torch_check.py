"""PyTorch on a real GPU with tensormalloc's pool underneath, two ways:
  mode "nocache": PYTORCH_NO_CUDA_MEMORY_CACHING=1 under LD_PRELOAD (PyTorch calls cudaMalloc);
  mode "pluggable": CUDAPluggableAllocator over tm_cuda_alloc / tm_cuda_free;
  mode "native": PyTorch's own caching allocator, for comparison.
Trains a small CNN for a fixed number of steps from a fixed seed and prints JSON: the losses
(for comparing results across modes), ms per step (median), and in native mode PyTorch's
peak allocated and reserved memory."""
import json
import os
import statistics
import sys
import time

mode = sys.argv[1]
lib = sys.argv[2] if len(sys.argv) > 2 else ""

import torch  # noqa: E402

if mode == "pluggable":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "tm_cuda_alloc", "tm_cuda_free")
    torch.cuda.memory.change_current_allocator(alloc)

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
dev = torch.device("cuda")
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(128, 256, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(256, 10),
).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator(device="cpu").manual_seed(1)
x = torch.randn(64, 3, 64, 64, generator=g).to(dev)
y = torch.randint(0, 10, (64,), generator=g).to(dev)
losses, times = [], []
for step in range(60):
    torch.cuda.synchronize()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    losses.append(loss.item())
out = {"mode": mode, "preloaded": "tensormalloc" in os.environ.get("LD_PRELOAD", ""),
       "ms_per_step": statistics.median(times[10:]) * 1e3, "losses": losses}
if mode == "native":
    # PyTorch's own figures, to compare with the peaks in tensormalloc's report.
    out["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    out["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
print(json.dumps(out))
