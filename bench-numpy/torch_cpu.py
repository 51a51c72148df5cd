"""PyTorch on CPU under the allocators its users preload, side by side, in lockstep.

For each workload (torch_workloads.py: MLP + Adam, a small transformer + AdamW, conv-net
inference, a DataLoader with 2 forked workers) one process per setup starts and warms up; then,
round after round, each process in turn (the order rotating every round) runs a turn of
--turn steps while the others wait. The first step of a turn follows the others' turns (idle
memory may have been given back meanwhile, as it would not be in a training loop) and is not
counted; the rest are back-to-back steps, and the round's figure for a setup is their median.
So every round measures every setup within a few seconds, and a burst of load on this shared
machine falls on all of them: each round gives tensormalloc's ratio to the best peer (the peer
with the lowest median), and the verdict on the median of those ratios is made only when its 95%
interval allows it (verdict.py), else "no verdict". CPU time (the process's threads and its
reaped workers) is judged the same way. Faults are minor faults per counted step. Memory: peak
RSS, and 3 s after the loop (model and optimizer alive, the step's temporaries freed) the
anonymous memory held (Anonymous less LazyFree, which the kernel takes back at no cost), the part
of it added since torch was loaded (the ~400 MB torch's libraries hold anyway vary by +-10 MB from
run to run), with LazyFree and the whole RSS beside it. Losses must be identical under every setup.

OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE, every setup alike): spinning threads
would burn CPU time while their partner waits for a core of this 2-core machine, and CPU time
would say nothing.

    torch_cpu.py [--rounds N] [--turn K] [--only WORKLOAD...] [--setups NAME...]
                 [--extra NAME=PRELOAD[:VAR=VALUE,...]...]   (more setups, interleaved.py's syntax)

BENCH_BEFORE=/path/to/old/libtensormalloc.so adds the setup "tensormalloc-before"."""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from verdict import describe, load_average, verdict  # noqa: E402

PYTHON = ROOT / ".venv-torch" / "bin" / "python"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
OURS = os.environ.get("BENCH_TENSORMALLOC", str(ROOT / "target" / "release" / "libtensormalloc.so"))
JEMALLOC = f"{LIBDIR}/libjemalloc.so.2"
TCMALLOC = f"{LIBDIR}/libtcmalloc_minimal.so.4"
# What `python -m torch.backends.xeon.run_cpu --enable_jemalloc` sets (torch/backends/xeon/run_cpu.py).
LAUNCHER_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"

SETUPS = {
    "glibc": {},
    "glibc-tuned": {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"},
    "jemalloc": {"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": LAUNCHER_CONF},
    "tcmalloc": {"LD_PRELOAD": TCMALLOC},
    "tensormalloc": {"LD_PRELOAD": OURS},
    # Where a user of the launcher's --enable_jemalloc would put us: in front of its jemalloc.
    "tm+jemalloc": {"LD_PRELOAD": f"{OURS} {JEMALLOC}", "MALLOC_CONF": LAUNCHER_CONF},
}
if os.environ.get("BENCH_BEFORE"):
    SETUPS["tensormalloc-before"] = {"LD_PRELOAD": os.environ["BENCH_BEFORE"]}
PEERS = ("glibc", "glibc-tuned", "jemalloc", "tcmalloc")
WORKLOADS = ("mlp", "transformer", "convnet", "dataloader")
BAR = 1.03  # "within 3%"
IDLE_S = 3


class Child:
    """One workload process under one setup, answering torch_workloads.py's serve commands."""

    def __init__(self, workload, setup, log):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORMALLOC_", "MALLOC_", "LD_PRELOAD"))}
        env.update(SETUPS[setup], OMP_WAIT_POLICY="PASSIVE")
        self.p = subprocess.Popen([str(PYTHON), str(HERE / "torch_workloads.py"), workload, "serve"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        self.setup = setup

    def wait_ready(self):
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"{self.setup}: the workload did not start (target/bench-torch.log): {line!r}")

    def ask(self, command):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()

    def answer(self):
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"{self.setup}: the workload ended early (target/bench-torch.log)")
        return json.loads(line)

    def quit(self):
        self.ask("quit")
        self.p.wait(timeout=60)


def run_workload(workload, setups, rounds, turn, log):
    children = {s: Child(workload, s, log) for s in setups}
    for c in children.values():
        c.wait_ready()
    per_round = {s: [] for s in setups}
    losses = {s: [] for s in setups}
    for r in range(rounds):
        k = r % len(setups)
        for s in setups[k:] + setups[:k]:
            c = children[s]
            c.ask(f"steps {turn}")
            out = c.answer()
            losses[s] += out["losses"]
            steady = slice(1, None) if turn > 1 else slice(None)
            per_round[s].append({
                "wall_ms": statistics.median(out["wall_ms"][steady]),
                "cpu_ms": statistics.median(out["cpu_ms"][steady]),
                "faults": statistics.mean(out["faults"][steady]),
            })
        print(f"  {workload}: round {r + 1}/{rounds} (load {load_average()})", file=sys.stderr, flush=True)
    for c in children.values():
        c.ask(f"idle {IDLE_S}")
    memory = {s: children[s].answer() for s in setups}
    for c in children.values():
        c.quit()
    return summarise(workload, setups, per_round, memory, losses)


def summarise(workload, setups, per_round, memory, losses):
    rows = {}
    for s in setups:
        rr = per_round[s]
        m = memory[s]
        rows[s] = {
            "wall_ms": statistics.median(x["wall_ms"] for x in rr),
            "cpu_ms": statistics.median(x["cpu_ms"] for x in rr),
            "faults": statistics.mean(x["faults"] for x in rr),
            "peak_rss_mb": m["peak_rss_mb"],
            "idle_held_mb": m["anon_mb"] - m["lazyfree_mb"],
            # What the workload and the allocator hold after idling, over what torch held before.
            "idle_added_mb": (m["anon_mb"] - m["lazyfree_mb"]) - (m["base_anon_mb"] - m["base_lazyfree_mb"]),
            "idle_lazyfree_mb": m["lazyfree_mb"],
            "idle_rss_mb": m["rss_mb"],
        }
    peers = [s for s in PEERS if s in setups]
    verdicts = {}
    if peers:
        best = min(peers, key=lambda s: rows[s]["wall_ms"])
        best_cpu = min(peers, key=lambda s: rows[s]["cpu_ms"])
        for s in setups:
            if s in PEERS:
                continue
            wall = [a["wall_ms"] / b["wall_ms"] for a, b in zip(per_round[s], per_round[best])]
            cpu = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(per_round[s], per_round[best_cpu])]
            verdicts[s] = {
                "best_peer": best, "wall_ratios": wall, "wall": describe(wall, BAR), "wall_verdict": verdict(wall, BAR),
                "best_cpu_peer": best_cpu, "cpu_ratios": cpu, "cpu": describe(cpu, BAR),
            }
    reference = losses[setups[0]]
    differ = [s for s in setups if losses[s] != reference]
    return {"rows": rows, "verdicts": verdicts, "losses_identical": not differ, "losses_differ": differ,
            "rounds": per_round}


def render(results, meta):
    lines = [
        f"Date {meta['date']}; {meta['machine']}; torch {meta['torch']}; {meta['rounds']} rounds of "
        f"{meta['turn']} steps (the first of each turn not counted); load average {meta['load_before']} before, "
        f"{meta['load_after']} after.", "",
        "| workload | setup | ms/step (wall) | CPU ms/step | faults/step | peak RSS MB | idle held MB (LazyFree aside) | of it added by the workload | idle LazyFree MB | idle RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w, res in results.items():
        for s, r in res["rows"].items():
            lines.append(f"| {w} | {s} | {r['wall_ms']:.1f} | {r['cpu_ms']:.1f} | {r['faults']:.0f} | {r['peak_rss_mb']:.0f} | "
                         f"{r['idle_held_mb']:.0f} | {r['idle_added_mb']:.0f} | {r['idle_lazyfree_mb']:.0f} | {r['idle_rss_mb']:.0f} |")
    lines += ["", "Ratios to the best peer (median of per-round ratios [95% interval], verdict against 1.03):", ""]
    lines.append("| workload | setup | wall vs best peer | CPU vs best CPU peer | faults vs tcmalloc | idle held vs jemalloc | losses |")
    lines.append("|---|---|---|---|---|---|---|")
    for w, res in results.items():
        rows = res["rows"]
        for s, v in res["verdicts"].items():
            faults = f"{rows[s]['faults']:.0f} vs {rows['tcmalloc']['faults']:.0f}" if "tcmalloc" in rows else "-"
            held = (f"{rows[s]['idle_held_mb']:.0f} vs {rows['jemalloc']['idle_held_mb']:.0f} "
                    f"(added {rows[s]['idle_added_mb']:.0f} vs {rows['jemalloc']['idle_added_mb']:.0f})") if "jemalloc" in rows else "-"
            same = "identical" if res["losses_identical"] else "DIFFER: " + " ".join(res["losses_differ"])
            lines.append(f"| {w} | {s} | {v['wall']} ({v['best_peer']}) | {v['cpu']} ({v['best_cpu_peer']}) | {faults} | {held} | {same} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "15")))
    ap.add_argument("--turn", type=int, default=3, help="steps per turn; the first is not counted")
    ap.add_argument("--only", nargs="*", choices=WORKLOADS, metavar="WORKLOAD")
    ap.add_argument("--setups", nargs="*", choices=list(SETUPS), metavar="SETUP", default=list(SETUPS))
    ap.add_argument("--extra", nargs="*", default=[], metavar="NAME=PRELOAD[:VAR=VALUE,...]",
                    help="more setups, e.g. tm-4M=target/release/libtensormalloc.so:TENSORMALLOC_THRESHOLD=4M")
    args = ap.parse_args()
    for text in args.extra:
        name, _, rest = text.partition("=")
        preload, _, variables = rest.partition(":")
        SETUPS[name] = {**dict(v.split("=", 1) for v in variables.split(",") if v), **({"LD_PRELOAD": preload} if preload else {})}
        args.setups.append(name)
    if not PYTHON.exists():
        print(f"torch_cpu: no PyTorch venv at {PYTHON.parent.parent} (scripts/setup makes it where the "
              "registry is reachable): nothing measured")
        return
    for lib in {v for s in args.setups for v in SETUPS[s].get("LD_PRELOAD", "").split()}:
        if not Path(lib).exists():
            raise SystemExit(f"torch_cpu: {lib} is missing (scripts/setup installs the peers; cargo build --release builds ours)")
    workloads = args.only or list(WORKLOADS)
    outdir = HERE / "results" if not args.only and not args.extra and args.setups == list(SETUPS) else HERE / "results" / "partial"
    outdir.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}",
        "torch": subprocess.run([str(PYTHON), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip(),
        "rounds": args.rounds, "turn": args.turn, "load_before": load_average(),
    }
    results = {}
    (ROOT / "target").mkdir(exist_ok=True)
    with open(ROOT / "target" / "bench-torch.log", "w") as log:
        for w in workloads:
            start = time.time()
            results[w] = run_workload(w, args.setups, args.rounds, args.turn, log)
            print(f"{w}: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    meta["load_after"] = load_average()
    md = render(results, meta)
    (outdir / "torch-cpu.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (outdir / "torch-cpu.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
