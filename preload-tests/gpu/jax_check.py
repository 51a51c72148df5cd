"""JAX on a real GPU with XLA_PYTHON_CLIENT_ALLOCATOR=platform (issue 18): XLA then allocates each
buffer from the driver as it needs it and frees it when done, so under the preload every buffer
goes through tensormalloc's pool, reached by JAX's own lookups of the driver (dlopen, dlsym,
cuGetProcAddress). A small jitted training loop over batches of four shapes (each shape a new
compilation, buffers of many sizes freed and reused), plus large arrays made and dropped; the
results are compared with NumPy's. Prints one JSON line; {"skipped": REASON} and status 0 when
jax or its GPU backend is missing."""
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")


def skip(reason):
    print(json.dumps({"skipped": reason}))
    sys.exit(0)


try:
    import jax
    import jax.numpy as jnp
except ImportError as e:
    skip(f"jax is not installed ({e})")
try:
    gpus = jax.devices("gpu")
except RuntimeError as e:
    skip(f"jax has no GPU backend ({e})")
if not gpus:
    skip("jax sees no GPU")

import numpy as np  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")  # float32 as NumPy computes it
t0 = time.perf_counter()


@jax.jit
def step(w, x):
    y = jnp.tanh(x @ w)
    return w - 0.01 * (x.T @ y) / x.shape[0], jnp.mean(y * y)


def step_np(w, x):
    y = np.tanh(x @ w)
    return w - np.float32(0.01) * (x.T @ y) / np.float32(x.shape[0]), float(np.mean(y * y))


rng = np.random.default_rng(0)
w_np = (rng.standard_normal((512, 512)) / 22.6).astype(np.float32)
w = jax.device_put(w_np, gpus[0])
losses, ref = [], []
for i in range(24):
    x_np = rng.standard_normal((256 + 64 * (i % 4), 512)).astype(np.float32)
    w, loss = step(w, jax.device_put(x_np, gpus[0]))
    w_np, loss_np = step_np(w_np, x_np)
    losses.append(float(loss))
    ref.append(loss_np)
w_diff = float(np.max(np.abs(np.asarray(w) - w_np)))
loss_diff = max(abs(a - b) for a, b in zip(losses, ref))

# Large buffers made and dropped, each read back: a block reused from the pool must hold what
# this computation wrote, not what the previous one left.
big_ok = True
for i, mb in enumerate((64, 16, 64, 256, 64)):
    a = jnp.full((mb << 20,), i + 1, dtype=jnp.uint8)  # on the default device, gpus[0]
    big_ok &= int(jnp.sum(a, dtype=jnp.uint32)) == (i + 1) * (mb << 20)
    big_ok &= int(a[-1]) == i + 1
    del a
ms = (time.perf_counter() - t0) * 1e3
ok = loss_diff < 1e-4 and w_diff < 1e-4 and big_ok
print(json.dumps({"scenario": "jax", "allocator": os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"], "device": str(gpus[0]),
                  "jax": jax.__version__, "steps": len(losses), "max_loss_diff": loss_diff, "max_weight_diff": w_diff,
                  "large_buffers_ok": big_ok, "failures": 0 if ok else 1, "ms": round(ms, 1)}))
sys.exit(0 if ok else 1)
