"""Issue 36, item 3: CUDA IPC of pooled blocks (Note [IPC] in src/device/pool/pointers.rs, Note [IPC
of expandable segments] in src/device/pool/exports.rs), between two processes over the stand-in
driver and runtime (c/fakecuda.c, c/fakecudart.c: simulators), c/cuda_ipc.c as sender and
receiver: blocks of 4 KiB to 64 MiB (two of each, side by side, so the small ones share segments
and chunks), their values checked in the receiver and its writes in the sender, through the
runtime's and the driver's entry points, in each pool mode and in expandable segments, the
receiver under the preload or not, beside the driver alone."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import LIB
from cudasim import cuda_program

# KiB: 4 KiB to 64 MiB; PyTorch's segment sizes (2 MiB, 20 MiB) among them.
SIZES = [4, 64, 512, 1024, 2048, 3000, 20480, 65536]
EXPANDABLE = {"TENSORMALLOC_CUDA_SEGMENTS": "expandable"}
POOLS = {"split": {}, "binned": {"TENSORMALLOC_CUDA_POOL": "binned"}, "sync-reuse": {"TENSORMALLOC_CUDA_SYNC": "reuse"}, "expandable": EXPANDABLE}
SEGMENTS = {"classic": {}, "expandable": EXPANDABLE}
OURS = "746d495043763100"  # "tmIPCv1\0": a handle of ours


def env_for(tmp_path, preloaded, extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_") and k not in ("LD_PRELOAD", "XDG_RUNTIME_DIR")}
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700, exist_ok=True)
    env.update({"XDG_RUNTIME_DIR": str(run_dir), "TM_TEST_SIZES": ",".join(map(str, SIZES)), "FAKECUDA_DEVICE_MEM": str(4 << 30), **(extra or {})})
    if preloaded:
        env["LD_PRELOAD"] = str(LIB)
    return env


class Sender:
    def __init__(self, env, api, role="send"):
        self.role = role
        self.p = subprocess.Popen([cuda_program("cuda_ipc"), role, api], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        assert self.p.returncode == 0 and f"{self.role} done" in out, err
        return err


def lines_of(stdout, word):
    """{block id: the word after it} for the receiver's lines that start with `word`."""
    return {l.split()[1]: l.split()[2] for l in stdout.splitlines() if l.startswith(word + " ")}


def receive(blocks, env, api):
    r = subprocess.run([cuda_program("cuda_ipc"), "receive", api], input="".join(blocks) + "end\n", env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "receive done" in r.stdout, r.stderr
    opens = lines_of(r.stdout, "open")
    closes = {l.split()[1]: l.split()[3] for l in r.stdout.splitlines() if l.startswith("close ")}
    # Every pointer an open handed out is unknown to the driver once closed (its mapping went).
    gone = lines_of(r.stdout, "gone")
    assert set(gone.values()) <= {"yes"} and len(gone) == sum(v in ("ok", "wrong") for v in opens.values()), r.stdout
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
    ours = [b for b in sender.blocks if b.split()[4].startswith(OURS)]
    if pool in ("split", "sync-reuse", "expandable"):
        # Blocks under 10 MiB share 2 and 20 MiB segments: handles of ours, said once; in
        # expandable segments every block's (the driver has no legacy handle for such memory).
        assert len(ours) == (len(sender.blocks) if pool == "expandable" else 2 * sum(1 for s in SIZES if s < 10240)), sender.blocks
        assert sum("tensormalloc's own" in l for l in err.splitlines()) == 1, err
    else:
        assert ours == [], sender.blocks


@pytest.mark.parametrize("api", ["runtime", "driver"])
@pytest.mark.parametrize("segments", list(SEGMENTS))
def test_a_receiver_without_the_preload_gets_an_error_never_other_memory(tmp_path, segments, api):
    """A receiver without the library cannot read our handles: the driver answers each with its
    error (invalid value); a handle the driver gave (a block that is its whole segment) opens onto
    the block. No open ever lands on other memory."""
    sender = Sender(env_for(tmp_path, True, SEGMENTS[segments]), api)
    opens, _, r = receive(sender.blocks, env_for(tmp_path, False), api)
    for b in sender.blocks:
        i, size, handle = b.split()[1], int(b.split()[2]), b.split()[4]
        if handle.startswith(OURS):
            assert opens[i] == "rc", (i, opens, r.stdout)
            assert f"open {i} rc 1" in r.stdout
        else:
            assert segments == "classic" and size >= 10 << 20 and opens[i] == "ok", (i, opens)
    assert "wrong" not in opens.values()
    sender.finish()


@pytest.mark.parametrize("api", ["runtime", "driver"])
@pytest.mark.parametrize("segments", list(SEGMENTS))
def test_the_handle_of_a_freed_block_never_opens_a_later_block(tmp_path, segments, api):
    """The sender frees an exported block and fills a new block of its size with 0xee: its
    handle opens nothing any more (its registry entry is withdrawn), and the new block never
    takes the freed one's place (a peer still mapping the segment would see it): a receiver
    gets an error, never 0xee."""
    env = env_for(tmp_path, True, SEGMENTS[segments])
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



@pytest.mark.parametrize("segments", list(SEGMENTS))
def test_a_peer_that_still_maps_a_freed_block_keeps_its_bytes(tmp_path, segments):
    """A receiver keeps every block open while the sender frees half of them, fills new blocks of
    their sizes with 0xee and gives its cache back (tm_trim): the receiver still reads each
    block's own values (an exported block is never handed out again, its memory never moved
    elsewhere), and every close succeeds. Then the sender frees the rest and trims: nothing of its
    pool is left at the driver, and no descriptor is left open but the channel's socket."""
    env = env_for(tmp_path, True, SEGMENTS[segments])
    sender = Sender(env, "runtime")
    r = subprocess.Popen([cuda_program("cuda_ipc"), "receive", "runtime", "hold"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    r.stdin.write("".join(sender.blocks) + "end\n")
    r.stdin.flush()
    seen = []
    for line in iter(r.stdout.readline, ""):
        seen.append(line)
        if line == "opened\n":
            break
    assert set(lines_of("".join(seen), "open").values()) == {"ok"}, ("".join(seen), r.stderr.read() if r.poll() is not None else "")
    for b in sender.blocks[::2]:
        sender.say(f"free {b.split()[1]}", lambda ls: ls[-1] == "freed\n")
    sender.say("trim", lambda ls: ls[-1] == "trimmed\n")
    out, err = r.communicate("recheck\n", timeout=60)
    assert r.returncode == 0 and "receive done" in out, err
    assert set(lines_of(out, "still").values()) == {"yes"} and len(lines_of(out, "still")) == len(sender.blocks), out
    closes = {l.split()[1]: l.split()[3] for l in out.splitlines() if l.startswith("close ")}
    assert set(closes.values()) == {"0"} and len(closes) == len(sender.blocks), out
    assert set(lines_of(out, "gone").values()) == {"yes"}, out
    used, fds = sender.say("drain", lambda ls: ls[-1].startswith("drained"))[-1].split()[1:]
    assert int(used) == 0, "the pool gave everything back to the driver"
    assert int(fds) == (1 if segments == "expandable" else 0), f"descriptors left open: {fds}"
    sender.finish()


@pytest.mark.parametrize("api", ["runtime", "driver"])
@pytest.mark.parametrize("pool", list(POOLS) + ["alone"])
def test_handles_of_forked_siblings_open_each_ones_own_block(tmp_path, pool, api):
    """The outlive hunter's finding: two workers forked by a parent that made no CUDA call (as
    torch.multiprocessing's fork workers) export one block each; same history, so the same
    addresses and buffer ids. The parent opens the first's handle, keeps it, opens the
    second's: each reads its own exporter's byte, as with the driver alone. Before, with
    expandable segments, the second open answered the first's mapping (0xaa where 0xbb was)."""
    env = env_for(tmp_path, pool != "alone", POOLS.get(pool))
    r = subprocess.run([cuda_program("cuda_ipc"), "siblings", api], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "siblings done" in r.stdout, r.stderr
    assert [l for l in r.stdout.splitlines() if l.startswith("sibling ")] == [f"sibling 0 0 {0xaa}", f"sibling 1 0 {0xbb}"], r.stdout


def unix_names(pid):
    """The abstract socket names our channel bound for process `pid` (from /proc/net/unix)."""
    with open("/proc/net/unix") as f:
        return [l.split()[-1] for l in f if l.split()[-1].startswith(f"@tensormalloc-ipc-{os.geteuid()}-{pid}")]


def threads(pid):
    return [open(f"/proc/{pid}/task/{t}/comm").read().strip() for t in os.listdir(f"/proc/{pid}/task")]


def test_the_channel_exists_only_once_something_was_exported(tmp_path):
    """Expandable segments make no socket and no thread of their own until a block is exported:
    a process that only allocates has neither; the first export starts both."""
    env = env_for(tmp_path, True, EXPANDABLE)
    holder = Sender(env, "runtime", role="hold")
    assert unix_names(holder.p.pid) == [] and "tensormalloc-ip" not in threads(holder.p.pid)
    holder.finish()
    sender = Sender(env, "runtime")
    # The name ends in 64 random bits (carried in the handle): nobody can hold it first.
    names = unix_names(sender.p.pid)
    assert len(names) == 1 and re.fullmatch(rf"@tensormalloc-ipc-{os.geteuid()}-{sender.p.pid}-[0-9a-f]{{16}}", names[0]), names
    # Our thread names itself once it runs (prctl): on a loaded machine that may come a moment
    # after the export returned, so its name is waited for, bounded.
    import time
    for _ in range(500):
        if threads(sender.p.pid).count("tensormalloc-ip") == 1:
            break
        time.sleep(0.01)
    assert threads(sender.p.pid).count("tensormalloc-ip") == 1, threads(sender.p.pid)
    sender.finish()


REGISTRY_ENTRY = 128  # bytes an IPC registry entry takes, after a header of as many


def handle_checksum(pid, entry, token, size, offset, channel):
    """src/device/ipc/handle.rs's checksum of a handle of ours."""
    mask = (1 << 64) - 1
    x = 0x9e3779b97f4a7c15 ^ (pid << 32 | entry)
    for v in (token, size, offset, channel):
        x = ((x ^ v) * 0xbf58476d1ce4e5b9) & mask
        x = ((x << 31) | (x >> 33)) & mask
    return x


def give_pid_again(block_line, registry, old_pid, new_pid):
    """The state the kernel leaves when it gives exporter `old_pid`'s pid to `new_pid` (an
    unrelated process): its registry entries and the handle in `block_line` name `new_pid`."""
    words = block_line.split()
    h = bytearray.fromhex(words[4])
    entry, token, size, offset, channel = (int.from_bytes(h[a:b], "little") for a, b in ((12, 16), (16, 24), (24, 32), (32, 40), (48, 56)))
    h[8:12] = new_pid.to_bytes(4, "little")
    h[40:48] = handle_checksum(new_pid, entry, token, size, offset, channel).to_bytes(8, "little")
    raw = bytearray(registry.read_bytes())
    for at in range(REGISTRY_ENTRY, len(raw), REGISTRY_ENTRY):
        for pid_at in (at + 4, at + 112):  # the entry's pid, and the pid its start time is of
            if int.from_bytes(raw[pid_at:pid_at + 4], "little") == old_pid:
                raw[pid_at:pid_at + 4] = new_pid.to_bytes(4, "little")
    registry.write_bytes(bytes(raw))
    return " ".join(words[:4] + [h.hex()]) + "\n"


@pytest.mark.parametrize("pid_given_again", [False, True])
@pytest.mark.parametrize("api", ["runtime", "driver"])
def test_a_receiver_whose_sender_is_gone_gets_an_error_and_one_line(tmp_path, api, pid_given_again):
    """The sender exported its blocks and died (its registry entries stay until reused): the
    receiver cannot reach it for the chunks' memory, and each open answers invalid value (1), as
    the driver answers a handle whose exporter is gone, with one stderr line saying the process
    has ended; never other memory. It answered 304 (the system's error) with a line advising
    TENSORMALLOC_CUDA_SEGMENTS=classic in the exporter, which could not have helped (the torchsim
    hunter). The same when the kernel has given the dead sender's pid to another process (a
    `sleep` here): it answered 304 and that advice (the outlive hunter)."""
    env = env_for(tmp_path, True, EXPANDABLE)
    sender = Sender(env, api)
    sender.p.send_signal(signal.SIGKILL)
    sender.p.communicate(timeout=60)
    blocks, pid = sender.blocks, sender.p.pid
    sleeper = subprocess.Popen(["sleep", "120"]) if pid_given_again else None
    try:
        if sleeper:
            registry = tmp_path / "run" / "tensormalloc-ipc"
            blocks = [give_pid_again(b, registry, pid, sleeper.pid) for b in blocks]
            pid = sleeper.pid
        opens, _, r = receive(blocks, env, api)
    finally:
        if sleeper:
            sleeper.kill()
            sleeper.wait()
    assert set(opens.values()) == {"rc"} and r.stdout.count(" rc 1\n") == len(blocks), r.stdout
    assert "TENSORMALLOC_CUDA_SEGMENTS=classic" not in r.stderr, r.stderr
    lines = [l for l in r.stderr.splitlines() if "which has ended" in l]
    assert len(lines) == 1 and f"process {pid}," in lines[0], r.stderr


@pytest.mark.parametrize("publisher", ["ended", "alive"])
@pytest.mark.parametrize("segments", list(SEGMENTS))
def test_entries_an_ended_exporter_left_under_a_pid_given_again_are_taken(tmp_path, segments, publisher):
    """The outlive hunter's finding: every entry of the IPC registry is live, published by a
    process that was killed (SIGKILL leaves its entries) and whose pid the kernel has given to an
    unrelated process (a `sleep`; the entries planted, with the start time a process of ours
    records). A new exporter's exports were refused ("all 4095 entries are live exports") for as
    long as that process lived: after a few restarts of a container that exports and is killed,
    for good. Now the entries are taken. Where the entries' start time is the sleep's own (a live
    exporter's), they are kept and the exports refused, said once."""
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        started = int(open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        raw = bytearray(REGISTRY_ENTRY * 4096)
        raw[0:8] = b"TMIPCRG1"
        for at in range(REGISTRY_ENTRY, len(raw), REGISTRY_ENTRY):
            raw[at:at + 4] = (2).to_bytes(4, "little")  # live
            raw[at + 4:at + 8] = sleeper.pid.to_bytes(4, "little")
            raw[at + 8:at + 16] = (at + 1).to_bytes(8, "little")  # a token
            raw[at + 104:at + 112] = (started if publisher == "alive" else started - 1).to_bytes(8, "little")
            raw[at + 112:at + 116] = sleeper.pid.to_bytes(4, "little")  # whose start that is
        env = env_for(tmp_path, True, SEGMENTS[segments])
        registry = tmp_path / "run" / "tensormalloc-ipc"
        registry.write_bytes(bytes(raw))
        registry.chmod(0o600)
        sender = Sender(env, "runtime")
        err = sender.finish()
    finally:
        sleeper.kill()
        sleeper.wait()
    # The small blocks share segments (and expandable ones chunks): their handles are ours.
    if publisher == "ended":
        assert sender.refused == [] and len(sender.blocks) == 2 * len(SIZES), (sender.refused, err)
        assert "IPC registry" not in err, err
    else:
        assert sender.refused, sender.blocks
        assert err.count("all 4095 entries are live exports") == 1, err


def all_stopped(pid):
    """Whether every thread of `pid` is stopped (state T in /proc/PID/task/*/stat)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


@pytest.mark.parametrize("api", ["runtime", "driver"])
def test_a_receiver_under_a_periodic_signal_still_gives_up_on_a_stopped_sender(tmp_path, api):
    """The sender exported its blocks and was stopped (SIGSTOP), and the receiver takes SIGALRM
    every 100 ms (a real-time profiler's timer): a timed receive fails with EINTR at each signal
    even under SA_RESTART (signal(7)), so a retry that starts the 5 s wait over never ends. Each
    open must still give up within its wait and answer 304 with one stderr line."""
    env = env_for(tmp_path, True, EXPANDABLE)
    sender = Sender(env, api)
    sender.p.send_signal(signal.SIGSTOP)
    try:
        # Every thread stopped (its exporter's too) before the receiver asks: on a loaded machine
        # the exporter's thread served the opens before it took the stop.
        deadline = time.monotonic() + 30
        while not all_stopped(sender.p.pid):
            assert time.monotonic() < deadline, "the sender did not stop"
            time.sleep(0.01)
        started = time.monotonic()
        opens, _, r = receive(sender.blocks[:2], {**env, "TM_TEST_ALARM_MS": "100"}, api)
        took = time.monotonic() - started
        assert set(opens.values()) == {"rc"} and r.stdout.count(" rc 304") == 2, r.stdout
        assert took < 20, f"two opens took {took:.1f} s"
        lines = [l for l in r.stderr.splitlines() if "TENSORMALLOC_CUDA_SEGMENTS=classic" in l]
        assert len(lines) == 1, r.stderr
    finally:
        sender.p.send_signal(signal.SIGCONT)
    sender.finish()


def test_a_driver_without_posix_descriptors_refuses_with_its_error_and_one_line(tmp_path):
    """A device whose memory cannot be exported as POSIX file descriptors (the stand-in's
    FAKECUDA_NO_POSIX_FD=1): each export answers the driver's error (801, not supported) with one
    stderr line naming TENSORMALLOC_CUDA_SEGMENTS=classic; the blocks work and are freed as any."""
    sender = Sender(env_for(tmp_path, True, {**EXPANDABLE, "FAKECUDA_NO_POSIX_FD": "1"}), "runtime")
    assert sender.blocks == [] and set(sender.refused) == {"refused 801\n"} and len(sender.refused) == 2 * len(SIZES), sender.refused
    used, fds = sender.say("drain", lambda ls: ls[-1].startswith("drained"))[-1].split()[1:]
    assert (int(used), int(fds)) == (0, 0)
    err = sender.finish()
    lines = [l for l in err.splitlines() if "TENSORMALLOC_CUDA_SEGMENTS=classic" in l]
    assert len(lines) == 1 and "refused (error 801)" in lines[0], err
