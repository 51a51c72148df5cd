"""The seed expression (a*b)**2 + 3 on 10M float64 arrays: prints its minor page faults per
evaluation and a digest of the result, as JSON."""
import hashlib
import json
import resource
import sys

import numpy as np

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 20
rng = np.random.default_rng(42)
a = rng.random(n)
b = rng.random(n)
c = None
for _ in range(3):  # warm up: the first evaluations fault under every allocator
    c = (a * b) ** 2 + 3
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
digests = set()
for _ in range(iterations):
    c = (a * b) ** 2 + 3
    digests.add(hashlib.sha256(c.tobytes()).hexdigest())
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
z = np.zeros(n)
assert not z.any(), "np.zeros must be zero (calloc from the cache)"
print(json.dumps({"faults_per_iter": faults / iterations, "digests": sorted(digests),
                  "sum": float(c.sum())}))
