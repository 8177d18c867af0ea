"""Acknowledgements on the event socket, so that a sampler killed with lines unread in its socket loses none.

Each line a sender sends after its hello has a sequence number (implicit: the hello says the first line's,
the following lines count up). The sampler says now and then (`{"ack": N}`: every `ACK_EVERY_LINES` lines or
`ACK_INTERVAL_S`, never per line) that it has journaled every line before N; the sender keeps the lines
from the oldest unacknowledged one (bounded), sends them again to the next sampler, and that sampler skips
the ones it already has (its journal keeps each stream's mark), so nothing is stored twice."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

ACK_EVERY_LINES = 16  # a line holds up to 256 events: an ack every few thousand events at most...
ACK_INTERVAL_S = 0.25  # ...or every quarter of a second, whichever comes first
MAX_UNACKED_BYTES = 8 << 20  # the sender's window: past it, events wait in its queue (bounded, drops counted)
MAX_STREAMS = 4096  # streams (sending processes) whose marks a sampler keeps; the least recent go first
_MAX_SEQ = (1 << 63) - 1


class SentLine(NamedTuple):
    """One line of a sender's stream, as sent (and sent again after a reconnection)."""

    seq: int
    payload: bytes
    events: int  # event records it carries (0: a control message)


class Unacked:
    """The sender's lines from the oldest one the sampler has not acknowledged; contiguous in `seq`."""

    def __init__(self, max_bytes: int = MAX_UNACKED_BYTES) -> None:
        self.lines: deque[SentLine] = deque()
        self.bytes = 0
        self.next_seq = 0  # the seq the next new line gets
        self.acked = 0  # every line before this one is acknowledged
        self.acks: bool | None = None  # None until a sampler acknowledges (one that predates acks never does)
        self._max = max_bytes

    def add(self, payload: bytes, events: int) -> SentLine:
        line = SentLine(self.next_seq, payload, events)
        self.next_seq += 1
        self.lines.append(line)
        self.bytes += len(payload)
        return line

    def get(self, seq: int) -> SentLine | None:
        if not self.lines:
            return None
        i = seq - self.lines[0].seq
        return self.lines[i] if 0 <= i < len(self.lines) else None

    def first_seq(self) -> int:
        return self.lines[0].seq if self.lines else self.next_seq

    def full(self) -> bool:
        return self.bytes >= self._max

    def ack(self, upto: int, sent_before: int) -> None:
        """The sampler has every line before `upto`; lines not yet (re)sent on this connection stay, since the
        connection numbers its lines in order (they are skipped there as duplicates)."""
        self.acks = True
        self.acked = max(self.acked, min(upto, self.next_seq))
        self.trim(sent_before)

    def trim(self, sent_before: int) -> None:
        limit = min(self.acked, sent_before)
        while self.lines and self.lines[0].seq < limit:
            self.bytes -= len(self.lines.popleft().payload)

    def release(self, before: int) -> list[SentLine]:
        """Stop keeping the lines before `before` (a sampler that does not acknowledge): returns them."""
        out = []
        while self.lines and self.lines[0].seq < before:
            out.append(self.lines.popleft())
            self.bytes -= len(out[-1].payload)
        return out


class StreamMarks:
    """The sampler's side: per stream, the next line it expects (`received`) and the next one it has
    journaled or stored (`durable`, what it acknowledges). Bounded to `MAX_STREAMS` streams."""

    def __init__(self, max_streams: int = MAX_STREAMS) -> None:
        self.received: dict[int, int] = {}
        self.durable: dict[int, int] = {}
        self.advanced: dict[int, int] = {}  # received since the last `take()`
        self.duplicates = 0  # lines skipped because they were had already
        self.held: dict[int, int] = {}  # streams with lines that missed the journal: acknowledged once stored
        self._max = max_streams

    def seed(self, marks: dict[int, int]) -> None:
        """Marks replayed from a previous sampler's journal."""
        for stream, seq in marks.items():
            self._raise(self.received, stream, seq)
            self._raise(self.durable, stream, seq)

    def accept(self, stream: int, seq: int) -> bool:
        """Whether line `seq` of `stream` is new (else it is a duplicate, to skip)."""
        if seq < self.received.get(stream, 0):
            self.duplicates += 1
            return False
        self._raise(self.received, stream, seq + 1)
        self.advanced[stream] = seq + 1
        return True

    def take(self) -> dict[int, int]:
        out, self.advanced = self.advanced, {}
        return out

    def journaled(self, marks: dict[int, int], *, ok: bool) -> None:
        """These lines were journaled (`ok`), or not (journal off, full, a write failed). A stream with lines
        that missed the journal is acknowledged only once they are stored (`stored`): a later line journaled
        must not acknowledge them too, since an acknowledgement means "every line before N"."""
        for stream, seq in marks.items():
            if ok and stream not in self.held:
                self._raise(self.durable, stream, seq)
            else:
                self.held[stream] = max(seq, self.held.get(stream, 0))

    def stored(self) -> None:
        """Everything received is stored in the run: the held streams can be acknowledged."""
        held, self.held = self.held, {}
        self.confirm(held)

    def confirm(self, marks: dict[int, int]) -> None:
        """These lines are journaled (or stored): they can be acknowledged."""
        for stream, seq in marks.items():
            self._raise(self.durable, stream, seq)

    def _raise(self, marks: dict[int, int], stream: int, seq: int) -> None:
        if seq > marks.get(stream, -1):
            marks.pop(stream, None)  # most recent last: the least recent stream is forgotten first
            marks[stream] = seq
            if len(marks) > self._max:
                del marks[next(iter(marks))]


def stream_of(hello: dict) -> tuple[int, int] | None:
    """A hello's `stream` (the sending process's random id) and `seq` (its first line's number), or None: a
    sender that predates acknowledgements (or sends nonsense there) gets none and is not de-duplicated."""
    stream, seq = hello.get("stream"), hello.get("seq")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_SEQ for v in (stream, seq)):
        return None
    return stream, seq  # type: ignore[return-value]


def ack_of(message: dict) -> int | None:
    """The N of a sampler's `{"ack": N}`, or None when the message is something else."""
    n = message.get("ack")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _MAX_SEQ else None
