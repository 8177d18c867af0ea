"""Framework events from the job to the sampler: emit() only queues, a thread ships them over a Unix
socket, the sampler writes them per rank. Nothing here may raise into, or block, the training code."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

import stallwatch
from stallwatch.collect.event_server import EventServer
from stallwatch.collect.events import EventSender, process_identity
from stallwatch.records import FrameworkEvent

from ._support import stallwatch as run_cli

T0 = 1_763_790_000_000_000


def _event(i: int, pid: int = 1) -> FrameworkEvent:
    return FrameworkEvent("step", "train_step", T0 + i * 1000, T0 + i * 1000 + 900, "TRAIN", i, pid, "")


@pytest.fixture
def address():
    d = tempfile.mkdtemp(prefix="sw-test-")
    yield os.path.join(d, "events.sock")
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    os.rmdir(d)


def _collect(server: EventServer, want: int, timeout_s: float = 10) -> list:
    import select

    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        ready, _, _ = select.select(server.fds(), [], [], 0.1)
        got += server.receive(ready)
    return got


def test_events_arrive_in_order_with_the_senders_identity(address, monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    server = EventServer(address)
    sender = EventSender(address)
    try:
        for i in range(5000):
            sender.emit(_event(i))
        got = _collect(server, 5000)
        assert [e.step for _, e in got] == list(range(5000))
        assert got[0][1] == _event(0)
        assert got[0][0] == {"rank": 5, "local_rank": 1, "world_size": 8, "pid": os.getpid()}
        assert server.identities == [got[0][0]]
    finally:
        sender.close()
        server.close()
    assert not os.path.exists(address)


def test_without_a_sampler_emit_keeps_quietly_and_never_raises(address, caplog):
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    sender = EventSender(address)  # nobody listens there
    for i in range(100):
        sender.emit(_event(i))
    t = time.monotonic()
    sender.close(timeout_s=1.0)
    assert time.monotonic() - t < 5  # a hang guard, not a performance threshold
    assert sender.sent == 0 and sender.dropped == 100  # kept until the process ended, then counted as lost
    said = [r for r in caplog.records if "cannot reach the stallwatch sampler" in r.getMessage()]
    assert len(said) <= 1


def test_a_full_queue_drops_and_counts_instead_of_growing(address):
    sender = EventSender(address, max_queued=10)
    sender._stop.set()  # hold the shipping thread: the queue can only fill
    sender._thread.join()
    for i in range(25):
        sender.emit(_event(i))
    assert len(sender._queue) == 10 and sender.dropped == 15
    sender.close(timeout_s=0)  # nobody listens: the 10 kept are lost at the end, counted
    assert sender.dropped == 25


def test_the_sender_reconnects_when_the_sampler_comes_back(address, monkeypatch):
    import stallwatch.collect.events as events

    monkeypatch.setattr(events, "RECONNECT_AFTER_S", 0.2)
    monkeypatch.setattr(events, "SEND_INTERVAL_S", 0.1)
    sender = EventSender(address)
    sender.emit(_event(0))
    time.sleep(0.5)  # no sampler yet: kept
    server = EventServer(address)  # a restarted sampler binds the same path
    try:
        for i in range(1, 11):
            sender.emit(_event(i))
            time.sleep(0.05)
        got = _collect(server, 11, timeout_s=10)
        assert [e.step for _, e in got] == list(range(11)) and sender.dropped == 0
    finally:
        sender.close()
        server.close()


def test_the_server_ignores_malformed_lines_and_drops_abusive_connections(address):
    import socket

    server = EventServer(address)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address)
        ident = '{"hello": {"rank": 0, "local_rank": 0, "world_size": 1, "pid": 1}}\n'
        good = '[["step", "s", 1, 2, "TRAIN", 0, 1, ""]]\n'
        import base64
        import marshal

        garbage = ("M!!not base64\n" + "M" + base64.b64encode(b"\xff\x00garbage").decode() + "\n"
                   + "M" + base64.b64encode(marshal.dumps([("step", "s", 1, 2, "TRAIN", 0.5, 1, "")])).decode() + "\n")
        s.sendall((ident + "not json\n" + '[["too", "short"]]\n' + '{"not": "a batch"}\n' + garbage
                   + '[["step", "s", "1", 2, "TRAIN", 0, 1, ""]]\n' + '[["step", 5, 1, 2, "TRAIN", 0, 1, ""]]\n' + good).encode())
        got = _collect(server, 1)
        assert [e.name for _, e in got] == ["s"]
        import threading

        def flood() -> None:  # an endless line: the connection is dropped, the server lives on
            try:
                s.sendall(b"x" * (2 << 20))
            except OSError:
                pass

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while len(server.fds()) > 1 and time.monotonic() < deadline:
            _collect(server, 1, timeout_s=0.2)
        assert len(server.fds()) == 1  # only the listener is left
        t.join(5)
    finally:
        server.close()


def test_end_to_end_two_ranks_through_stallwatch_run(tmp_path: Path):
    """Two processes of one job (as torchrun starts them) each send their events; the run holds both ranks."""
    worker = tmp_path / "rank.py"
    worker.write_text(
        "import os, time\n"
        "from stallwatch.collect.events import sender_from_env\n"
        "from stallwatch.records import FrameworkEvent\n"
        "s = sender_from_env()\n"
        "t = time.time_ns() // 1000\n"
        "for i in range(200):\n"
        "    s.emit(FrameworkEvent('step', 'train_step', t + i * 100, t + i * 100 + 90, 'TRAIN', i, os.getpid()))\n"
    )
    job = tmp_path / "job.py"
    job.write_text(
        "import os, subprocess, sys\n"
        f"procs = [subprocess.Popen([sys.executable, {str(worker)!r}], env=dict(os.environ, RANK=str(r), "
        "LOCAL_RANK=str(r), WORLD_SIZE='2')) for r in range(2)]\n"
        "sys.exit(max(p.wait() for p in procs))\n"
    )
    run = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off",
                "--interval", "100ms", "--out", str(run), "--node", "n", "--", sys.executable, str(job))
    assert p.returncode == 0, p.stderr
    t = stallwatch.open_run(str(run)).framework(kinds=["step"])
    assert sorted(set(t["rank"].to_pylist())) == [0, 1]
    for rank in (0, 1):
        steps = [s for s, r in zip(t["step"].to_pylist(), t["rank"].to_pylist()) if r == rank]
        assert steps == list(range(200))
    ranks = stallwatch.open_run(str(run)).info["nodes"]["n"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["world_size"] == 2 for r in ranks)


def test_identity_defaults_outside_a_distributed_launcher(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert process_identity() == {"rank": 0, "local_rank": 0, "world_size": 1, "pid": os.getpid()}
    monkeypatch.setenv("RANK", "not-a-number")
    assert process_identity()["rank"] == 0


# -- fuzzing the decoder: any line is events or one ignored line, never an exception into the sampler -------------

import base64  # noqa: E402
import json  # noqa: E402
import marshal  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stallwatch.collect.events import decode_batch  # noqa: E402
from tests.fuzz import JSON, NASTY_INTS, SCALARS, fuzz, json_bytes  # noqa: E402

_FIELD = SCALARS | st.sampled_from(["step", "forward", "TRAIN", ""]) | NASTY_INTS
_EVENTS = st.lists(st.lists(_FIELD, min_size=7, max_size=9)
                   | st.tuples(*[_FIELD] * 8, st.lists(st.lists(_FIELD, min_size=4, max_size=6), max_size=3)),
                   max_size=5)


def _marshal_line(value) -> bytes | None:
    try:
        return b"M" + base64.b64encode(marshal.dumps(value))
    except ValueError:  # marshal cannot write it (an int past its range): not a line a sender makes
        return None


def _check(events) -> None:
    for e in events:
        assert isinstance(e, FrameworkEvent)
        assert all(isinstance(v, str) for v in (e.kind, e.name, e.mode, e.args))
        assert all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in (e.start_us, e.end_us, e.pid))


@fuzz(300)
@given(_EVENTS | JSON, st.booleans())
def test_fuzz_decode_batch(batch, as_marshal):
    line = _marshal_line(batch) if as_marshal else json_bytes(batch)
    if line is None:
        return
    try:
        events = decode_batch(line)
    except ValueError:
        return
    _check(events)


_HELLO = st.dictionaries(st.sampled_from(["rank", "local_rank", "world_size", "pid", "x"]), _FIELD, max_size=5)


@fuzz(60)
@given(hello=_HELLO | JSON, lines=st.lists(_EVENTS.map(json_bytes) | JSON.map(json_bytes) | st.binary(max_size=40)
                                           .filter(lambda b: b"\n" not in b), max_size=4))
def test_fuzz_the_server(address_for_fuzz, hello, lines):
    """Whatever a process sends (its hello included), receive() returns typed events from a sane identity and
    never raises into the sampler's loop."""
    import socket

    server = address_for_fuzz
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(server.address)
        s.sendall(json_bytes({"hello": hello}) + b"\n" + b"\n".join(lines) + b"\n")
        s.shutdown(socket.SHUT_WR)
        got = _until_dropped(server)
    finally:
        s.close()
    for identity, item in got:
        assert set(identity) == {"rank", "local_rank", "world_size", "pid"}
        assert all(isinstance(v, int) and 0 <= v < 2**31 for v in identity.values())
        if isinstance(item, FrameworkEvent):
            _check([item])


def _until_dropped(server: EventServer, timeout_s: float = 10) -> list:
    """What the server received until it saw the connection end (it then holds only its listener)."""
    import select

    got: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select(server.fds(), [], [], 0.05)
        got += server.receive(ready)
        if len(server.fds()) == 1 and not ready:
            return got
    raise AssertionError("the server did not finish reading a connection")


@pytest.fixture
def address_for_fuzz(address):
    server = EventServer(address)
    yield server
    server.close()


def test_what_a_full_queue_dropped_reaches_the_sampler_as_a_loss(address):
    """Dropped events are counted with their span and told to the sampler, which records a `loss` event."""
    from stallwatch.records import LOSS

    sender = EventSender(address, max_queued=10)
    for i in range(25):  # no sampler yet: 10 kept, 15 dropped
        sender.emit(_event(i))
    server = EventServer(address)
    try:
        got = _collect(server, 11, timeout_s=10)
    finally:
        sender.close()
        server.close()
    events = [e for _, e in got]
    assert [e.step for e in events if e.kind == "step"] == list(range(10))
    [loss] = [e for e in events if e.kind == LOSS]
    assert json.loads(loss.args) == {"events": 15, "steps": 15}
    assert (loss.start_us, loss.end_us) == (_event(10).start_us, _event(24).start_us)


def test_a_message_larger_than_the_sockets_room_reaches_the_job_whole(address):
    """A broadcast of 600 KB to a process whose socket takes less at once: the rest is sent as the process
    reads, never cut (a partial send was ignored: the job got half a line, and never the message)."""
    import json
    import socket

    server = EventServer(address)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address)
        s.sendall(b'{"hello": {"rank": 0, "local_rank": 0, "world_size": 1, "pid": 1}}\n')
        _collect(server, 1, timeout_s=0.5)  # reads the hello
        big = {"config": {"stop_training": "y" * 600_000}}
        server.broadcast(big)
        s.settimeout(0.1)
        got = b""
        deadline = time.monotonic() + 20
        while got.count(b"\n") < 1 and time.monotonic() < deadline:
            try:
                got += s.recv(1 << 16)
            except TimeoutError:
                pass
            server.push()  # the sampler's loop does this every round
        assert json.loads(got.split(b"\n")[0]) == big and server.unsent_bytes() == 0
    finally:
        s.close()
        server.close()
