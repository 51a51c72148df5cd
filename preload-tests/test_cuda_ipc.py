"""Issue 36, item 3: CUDA IPC of pooled blocks (Note [IPC] in src/device/pool/pointers.rs), between
two processes over the stand-in driver and runtime (c/fakecuda.c, c/fakecudart.c: simulators),
c/cuda_ipc.c as sender and receiver: blocks of 4 KiB to 64 MiB (two of each, side by side, so the
small ones share segments), their values checked in the receiver and its writes in the sender,
through the runtime's and the driver's entry points, in each pool mode, the receiver under the
preload or not, beside the driver alone."""
import os
import subprocess

import pytest

from conftest import LIB
from cudasim import cuda_program

# KiB: 4 KiB to 64 MiB; PyTorch's segment sizes (2 MiB, 20 MiB) among them.
SIZES = [4, 64, 512, 1024, 2048, 3000, 20480, 65536]
POOLS = {"split": {}, "binned": {"TENSORMALLOC_CUDA_POOL": "binned"}, "sync-reuse": {"TENSORMALLOC_CUDA_SYNC": "reuse"}}


def env_for(tmp_path, preloaded, extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_") and k not in ("LD_PRELOAD", "XDG_RUNTIME_DIR")}
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700, exist_ok=True)
    env.update({"XDG_RUNTIME_DIR": str(run_dir), "TM_TEST_SIZES": ",".join(map(str, SIZES)), "FAKECUDA_DEVICE_MEM": str(4 << 30), **(extra or {})})
    if preloaded:
        env["LD_PRELOAD"] = str(LIB)
    return env


class Sender:
    def __init__(self, env, api):
        self.p = subprocess.Popen([cuda_program("cuda_ipc"), "send", api], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.blocks, self.refused = [], []
        for line in iter(self.p.stdout.readline, ""):
            if line == "ready\n":
                break
            words = line.split()
            (self.blocks if words[0] == "block" else self.refused).append(line)
        else:
            raise AssertionError(self.p.stderr.read())

    def say(self, command, until):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        lines = []
        while True:
            line = self.p.stdout.readline()
            assert line, self.p.stderr.read()
            lines.append(line)
            if until(lines):
                return lines

    def finish(self):
        out, err = self.p.communicate("exit\n", timeout=60)
        assert self.p.returncode == 0 and "send done" in out, err
        return err


def receive(blocks, env, api):
    r = subprocess.run([cuda_program("cuda_ipc"), "receive", api], input="".join(blocks) + "end\n", env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "receive done" in r.stdout, r.stderr
    opens = dict(tuple(l.split()[1:3]) for l in r.stdout.splitlines() if l.startswith("open "))
    closes = {l.split()[1]: l.split()[3] for l in r.stdout.splitlines() if l.startswith("close ")}
    return opens, closes, r


def written(sender, n):
    lines = sender.say("check", lambda ls: len(ls) == n)
    return {l.split()[1]: l.split()[2] for l in lines}


@pytest.mark.parametrize("api", ["runtime", "driver"])
@pytest.mark.parametrize("pool", list(POOLS) + ["alone"])
def test_a_receiver_under_the_preload_reaches_the_same_bytes(tmp_path, pool, api):
    """Every block opens in the receiver onto its own bytes (never its segment's start), the
    receiver's write reaches the sender's block, and every close of a pointer we handed out
    succeeds: a split pool's blocks through handles of ours, whole segments (binned blocks, and
    large ones) through the driver's; with the driver alone, its own."""
    preloaded = pool != "alone"
    env = env_for(tmp_path, preloaded, POOLS.get(pool))
    sender = Sender(env, api)
    assert sender.refused == [] and len(sender.blocks) == 2 * len(SIZES)
    opens, closes, r = receive(sender.blocks, env, api)
    ids = [b.split()[1] for b in sender.blocks]
    assert all(opens.get(i) == "ok" for i in ids), (opens, r.stderr)
    assert all(closes.get(i) == "0" for i in ids), closes
    assert set(written(sender, len(ids)).values()) == {"yes"}
    err = sender.finish()
    ours = [b for b in sender.blocks if b.split()[4].startswith("746d495043763100")]  # "tmIPCv1\0"
    if pool in ("split", "sync-reuse"):
        # Blocks under 10 MiB share 2 and 20 MiB segments: handles of ours, said once.
        assert len(ours) == 2 * sum(1 for s in SIZES if s < 10240), sender.blocks
        assert sum("tensormalloc's own" in l for l in err.splitlines()) == 1, err
    else:
        assert ours == [], sender.blocks


@pytest.mark.parametrize("api", ["runtime", "driver"])
def test_a_receiver_without_the_preload_gets_an_error_never_other_memory(tmp_path, api):
    """A receiver without the library cannot read our handles: the driver answers each with its
    error (invalid value); a handle the driver gave (a block that is its whole segment) opens onto
    the block. No open ever lands on other memory."""
    sender = Sender(env_for(tmp_path, True), api)
    opens, _, r = receive(sender.blocks, env_for(tmp_path, False), api)
    for b in sender.blocks:
        i, size, handle = b.split()[1], int(b.split()[2]), b.split()[4]
        if handle.startswith("746d495043763100"):
            assert opens[i] == "rc", (i, opens, r.stdout)
            assert f"open {i} rc 1" in r.stdout
        else:
            assert size >= 10 << 20 and opens[i] == "ok", (i, opens)
    assert "wrong" not in opens.values()
    sender.finish()


@pytest.mark.parametrize("api", ["runtime", "driver"])
def test_the_handle_of_a_freed_block_never_opens_a_later_block(tmp_path, api):
    """The sender frees an exported block and fills a new block of its size with 0xee: its
    handle opens nothing any more (its registry entry is withdrawn), and the new block never
    takes the freed one's place (a peer still mapping the segment would see it): a receiver
    gets an error, never 0xee."""
    env = env_for(tmp_path, True)
    sender = Sender(env, api)
    small = [b for b in sender.blocks if int(b.split()[2]) == 4096]
    for b in small:
        sender.say(f"free {b.split()[1]}", lambda ls: ls[-1] == "freed\n")
    opens, _, r = receive(small, env, api)
    assert all(v == "rc" for v in opens.values()) and len(opens) == 2, (opens, r.stdout, r.stderr)
    assert "names no live block" in r.stderr, r.stderr
    # The others still open onto their own bytes.
    rest = [b for b in sender.blocks if b not in small]
    opens, _, _ = receive(rest, env, api)
    assert set(opens.values()) == {"ok"}, opens
    sender.finish()


def test_expandable_segments_refuse_with_the_setting_that_works(tmp_path):
    """Expandable segments (memory of the driver's virtual memory API) have no legacy handle:
    each export is refused with invalid value, and one line (once) names the setting that works."""
    sender = Sender(env_for(tmp_path, True, {"TENSORMALLOC_CUDA_SEGMENTS": "expandable"}), "runtime")
    err = sender.finish()
    assert sender.blocks == [] and set(sender.refused) == {"refused 1\n"}, sender.refused
    assert sum("TENSORMALLOC_CUDA_SEGMENTS=classic" in l for l in err.splitlines()) == 1, err
