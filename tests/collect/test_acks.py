"""Acknowledged event lines: what a killed sampler had in its socket unread reaches the next sampler, what it
had journaled is not stored twice, a full window is counted as a loss, and senders and samplers that predate
acknowledgements still work with the new ones (and never get a line twice)."""

from __future__ import annotations

import json
import os
import select
import socket
import tempfile
import threading
import time

import pytest

import stallwatch.collect.events as events
from stallwatch.collect import event_server
from stallwatch.collect.acks import ACK_EVERY_LINES, StreamMarks, Unacked
from stallwatch.collect.event_server import EventServer
from stallwatch.collect.events import EventSender
from stallwatch.records import LOSS, FrameworkEvent

T0 = 1_763_790_000_000_000
HELLO = {"rank": 0, "local_rank": 0, "world_size": 1, "pid": 1}


def _event(i: int) -> FrameworkEvent:
    return FrameworkEvent("step", "train_step", T0 + i * 1000, T0 + i * 1000 + 900, "TRAIN", i, 1, "")


@pytest.fixture
def address(monkeypatch):
    monkeypatch.setattr(events, "SEND_INTERVAL_S", 0.05)
    monkeypatch.setattr(events, "RECONNECT_AFTER_S", 0.1)
    d = tempfile.mkdtemp(prefix="sw-acks-")
    yield os.path.join(d, "events.sock")
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    os.rmdir(d)


def _collect(server: EventServer, want: int, timeout_s: float = 10, journal: bool = True, ack: bool = False) -> list:
    """Receive until `want` items came; `journal`: what arrives counts as journaled (acknowledgeable);
    `ack`: acknowledged as the sampler does, now and then."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        ready, _, _ = select.select(server.fds(), [], [], 0.05)
        got += server.receive(ready)
        if journal:
            server.marks.confirm(server.marks.take())
        if ack:
            server.acknowledge()
    return got


def _drain(server: EventServer) -> list:
    """Receive until nothing more came for half a second."""
    got: list = []
    while more := _collect(server, 1 << 30, timeout_s=0.5):
        got += more
    return got


def _steps(got: list) -> list[int]:
    return [e.step for _, e in got if isinstance(e, FrameworkEvent) and e.kind == "step"]


def _emit(sender: EventSender, first: int, n: int) -> None:
    for i in range(first, first + n):
        sender.emit(_event(i))
    sender.wake()


def _wait(what, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_lines_a_killed_sampler_left_unread_reach_the_next_one_and_none_twice(address):
    """Acknowledged lines (A) are forgotten, journaled but unacknowledged ones (B) are sent again and skipped,
    lines left unread in the dead sampler's socket (C) are sent again and stored: each step exactly once.
    Before acknowledgements, C was lost without a word."""
    first = EventServer(address)
    sender = EventSender(address)
    try:
        _emit(sender, 0, 1000)  # A: 4 lines
        got = _collect(first, 1000)
        first.acknowledge(now=time.monotonic() + 1)
        _wait(lambda: sender._unacked.acked == 4)
        _emit(sender, 1000, 1000)  # B: received and journaled, not acknowledged
        got += _collect(first, 1000)
        _emit(sender, 2000, 1000)  # C: in the socket, unread
        _wait(lambda: sender.sent == 3000)
        durable = dict(first.marks.durable)  # what its journal holds
        first.close()  # killed
        second = EventServer(address)
        second.marks.seed(durable)  # the next sampler replays the journal
        try:
            got += _collect(second, 1000)
            got += _drain(second)  # nothing more comes
            assert sorted(_steps(got)) == list(range(3000)) and len(_steps(got)) == 3000
            assert second.marks.duplicates == 4  # B again, skipped
            assert sender.dropped == 0
        finally:
            sender.close()
            second.close()
    finally:
        first.close()


def test_the_sampler_skips_lines_it_already_has(address):
    server = EventServer(address)
    socks = []
    try:
        def connect(seq: int, steps: range) -> None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(address)
            socks.append(s)
            lines = [json.dumps({"hello": {**HELLO, "stream": 7, "seq": seq}})]
            lines += [json.dumps([["step", "s", T0 + i, T0 + i, "TRAIN", i, 1, ""]]) for i in steps]
            s.sendall(("\n".join(lines) + "\n").encode())

        connect(0, range(0, 3))
        assert _steps(_collect(server, 3)) == [0, 1, 2]
        connect(1, range(1, 4))  # a reconnection that sends lines 1 and 2 again
        assert _steps(_collect(server, 1)) == [3]
        assert server.marks.duplicates == 2 and server.marks.received == {7: 4}
    finally:
        for s in socks:
            s.close()
        server.close()


def test_acknowledgements_come_every_few_lines_not_every_line(address):
    server = EventServer(address)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address)
        s.sendall((json.dumps({"hello": {**HELLO, "stream": 3, "seq": 0}}) + "\n").encode())
        _collect(server, 0, timeout_s=0.2)
        now = time.monotonic()
        for i in range(64):  # one line at a time, all within one ack interval
            s.sendall((json.dumps([["step", "s", T0 + i, T0 + i, "TRAIN", i, 1, ""]]) + "\n").encode())
            _collect(server, 1)
            server.acknowledge(now=now)
        time.sleep(0.1)
        acks = [json.loads(line)["ack"] for line in s.recv(1 << 16).decode().splitlines()]
        assert acks == [0, *range(ACK_EVERY_LINES, 65, ACK_EVERY_LINES)]  # the hello's, then every 16 lines
    finally:
        s.close()
        server.close()


def test_an_old_sender_gets_no_acknowledgements_and_is_not_deduplicated(address):
    server = EventServer(address)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address)
        line = json.dumps([["step", "s", T0, T0, "TRAIN", 0, 1, ""]])
        s.sendall((json.dumps({"hello": HELLO}) + "\n" + line + "\n" + line + "\n").encode())
        assert _steps(_collect(server, 2)) == [0, 0]
        server.acknowledge(now=time.monotonic() + 10)
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(100)  # nothing: it would not understand
    finally:
        s.close()
        server.close()


def test_a_sampler_without_acknowledgements_never_gets_a_line_twice(address, monkeypatch):
    """A new sender with a sampler that predates acknowledgements: as before, the line a lost connection cut is
    sent again, nothing else; the sender keeps no lines for it beyond its window."""
    monkeypatch.setattr(event_server, "stream_of", lambda hello: None)  # an old sampler: never acknowledges
    first = EventServer(address)
    sender = EventSender(address)
    sender._unacked = Unacked(max_bytes=4096)
    try:
        _emit(sender, 0, 1000)
        got = _collect(first, 1000)
        first.close()
        second = EventServer(address)
        try:
            _emit(sender, 1000, 1000)
            got += _collect(second, 1000)
            got += _drain(second)
            assert sorted(_steps(got)) == list(range(2000)) and len(_steps(got)) == 2000
            assert sender._unacked.acks is None and sender._unacked.bytes <= 4096 + 16 << 10
        finally:
            sender.close()
            second.close()
    finally:
        first.close()


def test_a_full_window_holds_events_in_the_queue_and_its_overflow_is_a_counted_loss(address):
    """A sampler that receives but does not acknowledge (its journal is behind): the sender stops at its
    window, the queue fills and drops, and what was dropped arrives as a loss: stored + lost = emitted."""
    server = EventServer(address)
    sender = EventSender(address, max_queued=500)
    sender._unacked = Unacked(max_bytes=8192)
    try:
        _emit(sender, 0, 3000)
        got = _collect(server, 3000, timeout_s=1.5, journal=False)
        assert len(got) < 3000 and sender.dropped > 0
        got += _collect(server, 3000 - len(got) - sender.dropped + 1)  # journaled now: acks open the window
        got += _drain(server)
    finally:
        sender.close()
        server.close()
    losses = [json.loads(e.args) for _, e in got if isinstance(e, FrameworkEvent) and e.kind == LOSS]
    steps = _steps(got)
    assert len(steps) == len(set(steps))
    assert len(steps) + sum(loss["steps"] for loss in losses) == 3000
    assert sum(loss["steps"] for loss in losses) == sender.dropped


def test_unacknowledged_lines_of_a_sampler_gone_for_good_are_counted_at_exit(address):
    server = EventServer(address)
    sender = EventSender(address)
    try:
        _emit(sender, 0, 300)
        _collect(server, 300, journal=False)  # received, never journaled (the sampler dies first)
        _wait(lambda: sender.sent == 300 and sender._unacked.acks)
    finally:
        server.close()
    sender.close(timeout_s=0.5)
    assert sender.dropped == 300 and sender.dropped_steps == 300


def test_at_exit_a_full_window_waits_for_acknowledgements_instead_of_dropping(address):
    """close() sends a backlog larger than the window to a sampler that acknowledges: nothing dropped."""
    server = EventServer(address)
    sender = EventSender(address)
    sender._unacked = Unacked(max_bytes=4096)
    got: list = []
    quiet = threading.Event()

    def sampler() -> None:  # receives, journals, acknowledges every quarter second, until all is in
        while True:
            more = _collect(server, 1 << 30, timeout_s=0.3, ack=True)
            got.extend(more)
            if quiet.is_set() and not more:
                return

    t = threading.Thread(target=sampler)
    t.start()
    try:
        _emit(sender, 0, 1)
        _wait(lambda: sender._unacked.acks is True)
        sender._stop.set()  # hold the shipping thread: close() sends the backlog
        sender._thread.join()
        _emit(sender, 1, 4999)
        sender.close(timeout_s=20)
        quiet.set()
        t.join(20)
    finally:
        server.close()
    assert sorted(_steps(got)) == list(range(5000)) and sender.dropped == 0


def test_lines_that_missed_the_journal_are_acknowledged_only_once_stored():
    """A journal write that fails, then one that succeeds: the second must not acknowledge the first's lines
    (an acknowledgement is "every line before N"), or a kill before they are stored loses them unsaid."""
    marks = StreamMarks()
    for seq in range(10):
        marks.accept(7, seq)
        marks.accept(8, seq)
    marks.journaled({7: 5, 8: 5}, ok=True)
    marks.journaled({7: 8}, ok=False)  # stream 7's lines 5-7: not journaled
    marks.journaled({7: 10, 8: 10}, ok=True)
    assert marks.durable == {7: 5, 8: 10}
    marks.stored()
    assert marks.durable == {7: 10, 8: 10} and marks.held == {}


def test_a_sampler_stopped_before_it_answers_the_hello_then_killed_loses_nothing(address, monkeypatch):
    """The sampler never read the connection (stopped before the job's first hello was answered), then was
    killed: the sender knows from its environment that this sampler acknowledges, so it kept the lines and the
    next sampler gets them all. Without that, they looked delivered and were lost without a word."""
    monkeypatch.setenv(events.ENV_ACKS, "1")
    first = EventServer(address)  # listening, never receiving: stopped
    sender = EventSender(address)
    try:
        _emit(sender, 0, 2000)
        _wait(lambda: sender.sent == 2000)  # all in the stopped sampler's socket
        assert not sender._unacked.acked and len(sender._unacked.lines) >= 8
        first.close()  # killed
        second = EventServer(address)
        try:
            got = _collect(second, 2000)
            got += _drain(second)
            assert sorted(_steps(got)) == list(range(2000)) and len(_steps(got)) == 2000
            assert sender.dropped == 0
        finally:
            sender.close()
            second.close()
    finally:
        first.close()


def test_lines_staged_at_exit_give_the_next_sampler_only_what_it_lacks(address, monkeypatch, tmp_path):
    """At exit a sender stages the lines it sent but was not told were journaled; a sampler that replays the
    file takes the lines beyond its journal's mark and skips the rest; a file that does not start with a
    hello gives nothing."""
    monkeypatch.setenv(events.ENV_ACKS, "1")
    monkeypatch.setenv(events.ENV_STAGING, str(tmp_path))
    first = EventServer(address)
    sender = EventSender(address)
    try:
        _emit(sender, 0, 1000)  # 4 lines, received and journaled up to the third
        got = _collect(first, 1000, journal=False)
        durable = {sender._stream: 3}
        sender.close(timeout_s=0.5)
    finally:
        first.close()
    (staged,) = tmp_path.glob(events.UNACKED_PREFIX + "*.lines")
    second = EventServer(address)
    try:
        second.marks.seed(durable)
        replayed = second.replay(staged.read_bytes())
        assert _steps(replayed) == list(range(768, 1000))  # the fourth line only
        assert sorted(_steps(got)) == list(range(1000))
        assert second.replay(b'[["step"]]\n' + staged.read_bytes()) == []
    finally:
        second.close()


def test_with_no_sampler_left_at_exit_the_queue_and_its_losses_are_staged_for_the_run(address, monkeypatch,
                                                                                      tmp_path):
    """The sampler is gone for good (dead past its restarts): at exit the sender stages what it queued and a
    `lost` line for what its full queue dropped, so the sampler that finishes the run stores the events and
    counts the loss. Before, both were dropped at exit and counted only in the dying process."""
    monkeypatch.setenv(events.ENV_ACKS, "1")
    monkeypatch.setenv(events.ENV_STAGING, str(tmp_path))
    sender = EventSender(address, max_queued=300)  # no server at the address: nothing is ever sent
    _emit(sender, 0, 500)
    sender.close(timeout_s=0.2)
    assert sender.dropped == 200  # the queue's overflow only; the 300 queued were staged, not dropped
    (staged,) = tmp_path.glob(events.UNACKED_PREFIX + "*.lines")
    server = EventServer(address)
    try:
        replayed = server.replay(staged.open("rb"))  # read line by line, as the sampler reads it
    finally:
        server.close()
    assert _steps(replayed) == list(range(300))
    (loss,) = [e for _, e in replayed if isinstance(e, FrameworkEvent) and e.kind == LOSS]
    assert json.loads(loss.args)["steps"] == 200, loss
