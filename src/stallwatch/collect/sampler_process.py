"""The system sampler's own process: `python -m stallwatch.collect.sampler_process`, driven over stdin.

stdin carries JSON lines from the launcher — first the start message, then {"pid": N} when the job started
and {"exit": code} when it ended — and is the sampler's lifeline: end-of-file (the launcher exited or was
killed) makes it take a last snapshot, flush and exit. Ctrl-C in the terminal is ignored here; the launcher
decides when sampling stops.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from stallwatch.collect.schedule import Periodic, TickSchedule
from stallwatch.collect.stacks import StackDump
from stallwatch.log import configure_cli_logging, logger, warn_once
from stallwatch.timeutil import now_us

FINAL_UPLOAD_TIMEOUT_S = 30.0
# Exit status telling the launcher that some of the run is only in the local spool (not uploaded).
EXIT_KEPT_IN_SPOOL = 3
EVENTS_TICK_S = 0.5  # framework events are stored on their own pace, not the snapshots' (which may be a minute)
FLUSH_WAIT_S = 0.5  # a flush request (before a SIGTERM reaches the job) waits this long at most for its answers


@dataclass
class StartMessage:
    """Everything the sampler needs, sent by the launcher as the first stdin line."""

    run: str
    node: str
    sample_interval_ms: int
    flush_interval_s: float
    max_storage_bytes: int
    gpu: bool = True
    spool_dir: str | None = None
    node_record: dict[str, Any] = field(default_factory=dict)
    upload_timeout_s: float = FINAL_UPLOAD_TIMEOUT_S
    files: dict[str, str] = field(default_factory=dict)
    events_address: str | None = None  # Unix socket path for the job's framework events
    staging_dir: str | None = None  # where the job stages profiler output for the sampler to store
    config: dict[str, Any] = field(default_factory=dict)  # the run's configuration at start (live fields change)

    @classmethod
    def from_json(cls, line: str) -> StartMessage:
        return cls(**json.loads(line))

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


class _Control:
    """Non-blocking line reader over stdin; `wait()` doubles as the sampler's sleep."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def wait(self, timeout: float, extra: list[int] | tuple[int, ...] = ()) -> tuple[list[dict[str, Any]], list[int]]:
        """Control messages that arrived within `timeout`, and which of the `extra` fds are readable."""
        fds = list(extra) if self.eof else [self.fd, *extra]
        if not fds:
            time.sleep(max(0.0, timeout))
            return [], []
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        others = [fd for fd in ready if fd != self.fd or self.eof]
        if self.eof or self.fd not in ready:
            return [], others
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.eof = True
            return [], others
        self.buf += chunk
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    logger.warning("ignoring a malformed control line from the launcher")
        return out, others


def run_sampler(start: StartMessage, control: _Control, ready_fd: int | None = None) -> int:
    from stallwatch.collect.system import SystemSampler
    from stallwatch.store import layout
    from stallwatch.store.chunk_writer import StorageBudget
    from stallwatch.store.location import RunLocation
    from stallwatch.store.rollup_writer import LeftoverRollups
    from stallwatch.store.spool import SpoolingSink
    from stallwatch.store.system_writer import SystemWriter

    stop = {"now": False}
    starter = os.getppid()  # the launcher (or the job process itself, with the in-job API)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))

    sampler = SystemSampler(gpu=start.gpu)
    if sampler.gpus.count == 0:
        logger.info("no GPU metrics on %s: %s", start.node, sampler.gpus.reason_absent)
    location = RunLocation(start.run)
    sink: Any = location
    if location.remote:
        spool = Path(start.spool_dir or default_spool(start.run, start.node))
        sink = SpoolingSink(location, spool)
    stored = 0 if location.remote else sum(
        e.size for top in (layout.system_dir(start.node), f"{layout.FRAMEWORK_DIR}/{start.node}",
                    f"{layout.TRACES_DIR}/{start.node}")
        for e in location.list(top))
    leftover = LeftoverRollups.of_node(location, start.node)  # a resumed node's, from its earlier sampler
    budget = StorageBudget(start.max_storage_bytes, stored + leftover.bytes)
    leftover.count_in(budget)
    interval_s = start.sample_interval_ms / 1000.0
    writer = SystemWriter(sink, start.node, sampler.keys, interval_us=start.sample_interval_ms * 1000,
                          flush_interval_us=int(start.flush_interval_s * 1e6),
                          max_bytes=start.max_storage_bytes, stored_bytes=stored, budget=budget)
    events = _EventSide(start, sink, budget, sampler)
    node_record = dict(start.node_record)
    node_record.update(sampler.describe_node(), node=start.node, sample_interval_ms=start.sample_interval_ms,
                       sample_intervals=[{"from_us": sampler.now_us(), "sample_interval_ms": start.sample_interval_ms}],
                       status="running")
    for rel, text in start.files.items():  # remote runs only: a later node leaves the first one's files alone
        try:
            sink.create_exclusive(rel, text.encode())
        except Exception as exc:
            logger.warning("cannot write %s (%s)", rel, exc)
    _write_node(sink, start.node, node_record)
    watcher = _watch_config(location, start)  # after the first write: a new run's folder exists to be watched
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")

    ticks = TickSchedule(interval_s)
    events_every = Periodic(EVENTS_TICK_S)
    config_every = Periodic(watcher.poll_s) if watcher is not None and not watcher.background else None
    told = watcher.fds() if watcher is not None and config_every is not None else []  # config.json written: told
    flush_until: float | None = None  # a flush request is waiting for the job's processes to answer
    asked_stacks = watcher.running.dump_stacks if watcher is not None else 0
    while not stop["now"] and not control.eof:
        fds = events.fds()  # no socket (system metrics only): no extra wake-ups
        deadlines = [ticks.next_deadline]
        if flush_until is not None:
            if events.flush_pending() == 0 or time.monotonic() >= flush_until:
                flush_until = None
                if ready_fd is not None:
                    _say(ready_fd, b"flushed\n")  # the launcher forwards the signal now
            else:
                deadlines.append(min(flush_until, time.monotonic() + 0.01))
        if fds:
            deadlines.append(events_every.deadline)
        if config_every is not None:
            deadlines.append(config_every.deadline)
        msgs, ready = control.wait(min(deadlines) - time.monotonic(), [*fds, *told])
        if told and ready and watcher is not None:
            watcher.notified(ready)
        events.receive(ready)
        if fds and events_every.due(ticks):
            events.tick(sampler.now_us())
            events_every.done()
        if config_every is not None and config_every.due(ticks):
            watcher.poll()
            config_every.done()
        if watcher is not None and (changed := watcher.take()) is not None:
            events.broadcast({"config": changed.to_dict()})
            if changed.dump_stacks != asked_stacks:  # each raise asks the job's processes once (not new ones)
                asked_stacks = changed.dump_stacks
                events.broadcast({"stacks": asked_stacks}, greet_new=False)
            if changed.sample_interval_ms != node_record["sample_interval_ms"]:
                _change_interval(changed.sample_interval_ms, ticks, writer, node_record, sampler.now_us())
                interval_s = changed.sample_interval_ms / 1000.0
                _write_node(sink, start.node, node_record)
        for msg in msgs:
            if "flush" in msg:
                events.request_flush(msg["flush"])
                flush_until = time.monotonic() + FLUSH_WAIT_S
            if "pid" in msg:
                sampler.set_job_pid(int(msg["pid"]))
                node_record["job_pid"] = int(msg["pid"])
            if "exit" in msg:
                node_record["exit_code"] = msg["exit"]
                node_record["end_us"] = msg.get("end_us")
                node_record["exit_signal"] = msg.get("signal")
                node_record["interrupted"] = bool(msg.get("interrupted"))
                for key in ("oom_kills", "memory_limit_bytes", "memory_peak_bytes"):  # the launcher's count of OOM-killer kills
                    if isinstance(msg.get(key), int) and not isinstance(msg.get(key), bool):
                        node_record[key] = msg[key]
        if not ticks.due():
            continue
        try:
            ts, values = sampler.snapshot()
            writer.append(ts, values)
            writer.tick(ts)
            events.note_snapshot(ts, sampler.keys, values)
        except Exception as exc:  # a reading that fails in a new way must not end sampling
            warn_once(f"snapshot-{type(exc).__name__}", "a snapshot failed (%s: %s); sampling goes on",
                      type(exc).__name__, exc)
        ticks.done()

    orphaned = False
    # Only a job its launcher started (a sibling): never the process that started this sampler itself (the in-job
    # API records its own process as the job, and a pipe closed by it is no launcher's death).
    if control.eof and "exit_code" not in node_record and isinstance(node_record.get("job_pid"), int) \
            and node_record["job_pid"] != starter:
        # The launcher went without a word (SIGKILL, a crash): its job would run on orphaned, unprofiled, holding
        # its allocation. It dies with its launcher, as it would have without stallwatch.
        if end_orphaned_job(node_record["job_pid"]):
            node_record.update(exit_code=128 + signal.SIGKILL, exit_signal="SIGKILL", end_us=now_us())
        orphaned = True  # nobody else removes the private folder now: this sampler does, once it is done
    # Cover the final partial interval; a job shorter than half an interval still gets its snapshot.
    if ticks.last_tick is None or ticks.since_last() >= interval_s / 2:
        try:
            ts, values = sampler.snapshot()
            writer.append(ts, values)
        except Exception:
            pass
    writer.close()
    if watcher is not None:
        watcher.close()
    events.close()
    node_record["ranks"] = events.identities()
    try:
        node_record["cpu_competitors"] = [c.to_json() for c in sampler.competitors()]
    except Exception:  # what other processes did is a detail: never a reason to lose the node record
        pass
    sampler.close()
    node_record.update(status="finished" if "exit_code" in node_record else "sampler_stopped",
                       samples_written=writer.samples_written, samples_dropped=writer.samples_dropped,
                       ticks_missed=ticks.missed, sampler_end_us=now_us(), **_own_cost())
    node_record.setdefault("end_us", now_us())
    _write_node(sink, start.node, node_record)
    if orphaned:
        _remove_private_folders(start)
    if location.remote:
        if sink.close(start.upload_timeout_s):
            if not start.spool_dir:
                try:
                    spool.parent.rmdir()  # the run's spool folder, once no node of it has anything left
                except OSError:
                    pass
        else:
            # The uploader may be inside a request to an endpoint that never answers, and pyarrow's S3
            # finalization at exit waits for it: leave now, everything unsent is in the spool (logged).
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(EXIT_KEPT_IN_SPOOL)
    return 0


MAX_INTERVAL_CHANGES = 1000  # the node record keeps the latest changes of the sampling interval


def _change_interval(interval_ms: int, ticks: TickSchedule, writer: Any, node_record: dict[str, Any],
                     at_us: int) -> None:
    """A live change of the sampling interval (validated by the config watcher): the schedule restarts from
    the last snapshot, the writer adapts its buffer, and the node record says from when (its acknowledgement)."""
    was = node_record["sample_interval_ms"]
    ticks.set_interval(interval_ms / 1000.0)
    writer.set_interval(interval_ms * 1000)
    history = node_record.setdefault("sample_intervals", [])
    history.append({"from_us": at_us, "sample_interval_ms": interval_ms})
    if len(history) > MAX_INTERVAL_CHANGES:
        del history[:len(history) - MAX_INTERVAL_CHANGES]
    node_record["sample_interval_ms"] = interval_ms
    logger.warning("sampling every %d ms from now on (was %d ms)", interval_ms, was)


def _watch_config(location: Any, start: StartMessage) -> Any:
    from stallwatch.collect.live_config import ConfigWatcher
    from stallwatch.config import ProfilerConfig

    try:
        return ConfigWatcher(location, ProfilerConfig.from_dict(start.config))
    except Exception as exc:
        logger.warning("live configuration is off (%s: %s)", type(exc).__name__, exc)
        return None


def _say(fd: int, line: bytes) -> None:
    try:
        os.write(fd, line)
    except OSError:
        pass  # the launcher is gone: nobody waits for it


class _EventSide:
    """The job's framework events: received on the socket, written per rank; profiler output handed to the
    artifact store. Absent when the socket could not be opened (said once): system sampling goes on."""

    def __init__(self, start: StartMessage, sink: Any, budget: Any, sampler: Any = None) -> None:
        from stallwatch.collect.event_server import EventServer

        from stallwatch.collect.live_counts import WRITE_EVERY_S, LiveCounts

        self._start, self._sink, self._budget, self._sampler = start, sink, budget, sampler
        self._writers: dict[int, Any] = {}
        remote = getattr(sink, "remote", True)  # a bucket (through the spool): a request per write
        self._live = LiveCounts(start.node, every_s=max(start.flush_interval_s, WRITE_EVERY_S) if remote
                                else WRITE_EVERY_S)
        self._server = None
        self._artifacts = None
        self._journal: Any = None
        self._journal_since_us: int | None = None
        if start.events_address:
            try:
                self._server = EventServer(start.events_address)
            except OSError as exc:
                logger.warning("cannot open the framework-event socket %s (%s); only system metrics are recorded",
                               start.events_address, exc.strerror or exc)
        if self._server is not None:
            self._open_journal(os.path.join(os.path.dirname(start.events_address or ""), "events.journal"))
        if self._server is not None and start.staging_dir:
            try:
                from stallwatch.collect.artifacts import ArtifactStore

                self._artifacts = ArtifactStore(sink, start.node, start.staging_dir, budget)
            except Exception as exc:
                logger.warning("profiler output cannot be stored (%s: %s)", type(exc).__name__, exc)

    def broadcast(self, message: dict[str, Any], *, greet_new: bool = True) -> None:
        if self._server is not None:
            try:
                self._server.broadcast(message, greet_new=greet_new)
            except Exception as exc:
                warn_once(f"events-broadcast-{type(exc).__name__}", "cannot tell the job (%s)", exc)

    def fds(self) -> list[int]:
        return self._server.fds() if self._server is not None else []

    def note_snapshot(self, ts: int, keys: list[Any], values: Any) -> None:
        """The live counts keep the newest snapshots (the live charts' edge before the next flush)."""
        if self._server is None:
            return
        try:
            self._live.snapshot(ts, keys, values)
        except Exception as exc:  # never a reason to stop sampling
            warn_once(f"live-snapshot-{type(exc).__name__}", "cannot keep the newest snapshot for the live counts "
                      "(%s: %s)", type(exc).__name__, exc)

    def request_flush(self, number: Any) -> None:
        if self._server is not None:
            try:
                self._server.request_flush(int(number))
            except Exception as exc:
                warn_once(f"events-flush-{type(exc).__name__}", "cannot ask the job to flush (%s)", exc)

    def flush_pending(self) -> int:
        try:
            return self._server.flush_pending() if self._server is not None else 0
        except Exception:
            return 0

    def receive(self, ready: list[int]) -> int:
        if not ready or self._server is None:
            return 0
        try:
            received = self._server.receive(ready)
            self._take(received)
            self._server.acknowledge()
        except Exception as exc:  # framework events must never stop system sampling
            warn_once(f"events-receive-{type(exc).__name__}", "receiving framework events failed (%s: %s)",
                      type(exc).__name__, exc)
            return 0
        return len(received)

    def _take(self, received: list[tuple[dict[str, int], Any]]) -> int:
        """What the server read: artifact notices to the artifact store, events journaled and buffered per rank;
        returns the number of events."""
        assert self._server is not None
        by_rank: dict[int, list] = {}
        for identity, item in received:
            if isinstance(item, StackDump):
                self._store_stacks(item)
                continue
            if isinstance(item, dict):
                if "notice" in item:  # what the job did with a profiling window: for the live counts
                    try:
                        self._live.notice(identity["rank"], item["notice"], now_us())
                    except Exception as exc:
                        warn_once("live-notice", "cannot keep a profiling notice (%s)", exc)
                    continue
                if self._artifacts is not None:
                    self._artifacts.submit(identity["rank"], item)
                continue
            by_rank.setdefault(identity["rank"], []).append(item)
        self._store(list(by_rank.items()), self._server.marks.take())
        return sum(len(events) for events in by_rank.values())

    def _store_stacks(self, item: StackDump) -> None:
        """A process's stacks, stored at once (small, and asked for because something is stuck)."""
        from stallwatch.store.stacks import write_dump

        try:
            rel = write_dump(self._sink, self._start.node, item.identity, item.dump)
            logger.info("stored the stacks of rank %d (pid %d) in %s", item.identity["rank"], item.identity["pid"], rel)
        except (ValueError, TypeError) as exc:
            warn_once("stacks-bad", "ignoring stacks a job process sent (%s)", exc)
        except Exception as exc:  # a store that fails: said once, sampling goes on
            warn_once(f"stacks-write-{type(exc).__name__}", "cannot store a job process's stacks (%s: %s)",
                      type(exc).__name__, exc)

    def _replay_staged(self) -> None:
        """At the end: the lines each job process sent but was not told were journaled, staged by it at its exit
        (`events.stage_unacked`); those this sampler lacks are taken (it was killed before reading them, and
        this is its successor), the rest skipped as duplicates."""
        from stallwatch.collect.artifacts import open_staged
        from stallwatch.collect.events import UNACKED_PREFIX

        folder = self._start.staging_dir
        if self._server is None or not folder:
            return
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith(UNACKED_PREFIX) and n.endswith(".lines"))
        except OSError:
            return
        recovered = 0
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open_staged(path) as fh:
                    recovered += self._take(self._server.replay(_lines(fh, MAX_STAGED_BYTES)))
                os.unlink(path)
            except (OSError, ValueError) as exc:
                warn_once("events-staged-lines", "cannot read the framework events a job process left (%s)", exc)
        if recovered:
            logger.warning("recovered %d framework events the job sent before it exited that no sampler had "
                           "stored", recovered)

    def _store(self, batches: list[tuple[int, list]], marks: dict[int, int]) -> None:
        """Journal first, with how far each sender got (a kill after this loses nothing, and the lines are
        acknowledged), then buffer for the run."""
        assert self._server is not None
        journaled = self._journal is not None and self._journal.append(batches, marks)
        self._server.marks.journaled(marks, ok=journaled)
        if journaled and self._journal_since_us is None and batches:
            self._journal_since_us = batches[0][1][0].start_us
        for rank, events in batches:
            try:
                self._live.add(rank, events)
            except Exception as exc:  # the counts are a convenience: never at the cost of storing the events
                warn_once(f"live-counts-{type(exc).__name__}", "cannot count events for the live counts (%s: %s)",
                          type(exc).__name__, exc)
            writer = self._writer(rank)
            for event in events:
                writer.append(event)
                if event.kind == "dataloader" and self._sampler is not None:
                    self._note_workers(event.args)

    def tick(self, now_us: int) -> None:
        # Every flush interval all ranks are stored at once, and then the journal is cleared.
        due = (self._journal_since_us is not None
               and now_us - self._journal_since_us >= self._start.flush_interval_s * 1e6)
        for w in self._writers.values():
            try:
                if due:
                    w.flush(now_us)
                w.tick(now_us)
            except Exception as exc:
                warn_once(f"events-write-{type(exc).__name__}", "writing framework events failed (%s: %s)",
                          type(exc).__name__, exc)
        stored = all(w.pending == 0 for w in self._writers.values())
        if due and self._journal is not None and stored:
            self._journal.clear(self._server.marks.received if self._server is not None else None)
            self._journal_since_us = None
        if self._server is not None:
            if stored:
                self._server.marks.stored()
            self._server.acknowledge()
        try:
            self._live.tick(self._sink, now_us)
        except Exception as exc:
            warn_once(f"live-tick-{type(exc).__name__}", "cannot write the live counts (%s: %s)", type(exc).__name__,
                      exc)

    def _open_journal(self, path: str) -> None:
        """Replay what a killed sampler had received but not stored, then journal from here on."""
        from stallwatch.collect.journal import EventJournal, replay

        replayed = replay(path)
        recovered = replayed.batches
        if self._server is not None:
            self._server.marks.seed(replayed.marks)
        if recovered:
            for rank, events in recovered:
                writer = self._writer(rank)
                for event in events:
                    writer.append(event)
            for w in self._writers.values():
                w.flush()
            logger.warning("recovered %d framework events the previous sampler had received but not stored",
                           sum(len(events) for _, events in recovered))
        self._journal = EventJournal(path)
        if recovered:
            if all(w.pending == 0 for w in self._writers.values()):
                self._journal.clear(replayed.marks)
            else:  # kept until a later flush stores them
                self._journal_since_us = recovered[0][1][0].start_us if recovered[0][1] else 0

    def close(self) -> None:
        if self._server is not None:
            for _ in range(1000):  # drain what the job sent with its last breath
                if not self.receive(self._server.fds()):
                    break
            self._replay_staged()
            self._server.close()
        for w in self._writers.values():
            w.close()
        if self._server is not None:
            try:
                self._live.tick(self._sink, now_us(), force=True, running=False)
            except Exception as exc:  # the journal and the artifacts below must still be closed
                warn_once("live-last", "cannot write the last live counts (%s)", exc)
        if self._journal is not None:
            self._journal.close(remove=all(w.pending == 0 for w in self._writers.values()))
        if self._artifacts is not None:
            self._artifacts.close(timeout_s=self._start.upload_timeout_s + 30)

    def _note_workers(self, args: str) -> None:
        pids = json.loads(args or "{}").get("worker_pids") or []
        if pids and all(isinstance(p, int) for p in pids):
            self._sampler.tree.add_workers(pids)

    def identities(self) -> list[dict[str, int]]:
        return list(self._server.identities) if self._server is not None else []

    def _writer(self, rank: int) -> Any:
        from stallwatch.store.framework_writer import FrameworkWriter

        w = self._writers.get(rank)
        if w is None:
            w = self._writers[rank] = FrameworkWriter(
                self._sink, self._start.node, rank, flush_interval_us=int(self._start.flush_interval_s * 1e6),
                max_bytes=self._start.max_storage_bytes, budget=self._budget)
        return w


# What a job process can stage at its exit: its unacknowledged window (8 MB) and its queue (100,000 events).
MAX_STAGED_BYTES = 256 << 20


def _lines(fh: Any, max_bytes: int) -> Iterator[bytes]:
    """A staged file's lines, read one at a time (a line past the server's limit is cut there, and refused by
    it), up to `max_bytes` in all: bounded memory whatever the file holds."""
    from stallwatch.collect.event_server import MAX_LINE_BYTES

    left = max_bytes
    while left > 0:
        line = fh.readline(min(left, MAX_LINE_BYTES + 1))
        if not line:
            return
        left -= len(line)
        yield line


def _remove_private_folders(start: StartMessage) -> None:
    """The launcher is gone: the node's private folders (event socket, journal, staging) go with this sampler,
    everything in them stored by now."""
    import shutil

    for path in {os.path.dirname(p) for p in (start.staging_dir, start.events_address) if p}:
        if os.path.basename(path).startswith("stallwatch-"):
            shutil.rmtree(path, ignore_errors=True)


def end_orphaned_job(pid: int) -> bool:
    """SIGKILL to the job's process group (the launcher made the job its leader, so its data-loader workers and
    other children are in it): what takes a launcher without a word is SIGKILL or a crash, and the job dies of
    the same signal it would have died of under `timeout -s KILL` without stallwatch. True when it was there.
    The job's own attributes are untouched (no parent-death signal set in it: a job may read or reset that)."""
    try:
        target = os.getpgid(pid)
        if target == pid:
            os.killpg(pid, signal.SIGKILL)
        else:  # it left the group the launcher made for it: only the process itself
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    logger.warning("stallwatch run ended without a word (killed?); its job (pid %d) and the processes of its "
                   "group are killed with it", pid)
    return True


def _write_node(sink: Any, node: str, record: dict[str, Any]) -> None:
    from stallwatch.store import layout

    try:
        sink.write_atomic(layout.node_json(node), json.dumps(record, indent=2, sort_keys=True).encode())
    except Exception as exc:  # said once: the same full disk fails the final write too
        warn_once(f"node-json-{node}", "cannot write %s (%s)", layout.node_json(node), exc)


def default_spool(run: str, node: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run.split("://", 1)[-1])
    return os.path.join(base, "stallwatch", "spool", safe, node)


def main() -> int:
    from stallwatch.collect.stdio import hold_closed_standard_fds

    hold_closed_standard_fds()  # started by a launcher whose stderr was closed
    configure_cli_logging()
    control = _Control(sys.stdin.fileno())
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(control.fd, 1)
        if not chunk:
            return 1  # the launcher went away before saying anything
        line += chunk
    start = StartMessage.from_json(line.decode())
    ready_fd = sys.stdout.fileno()
    try:
        return run_sampler(start, control, ready_fd)
    except Exception as exc:
        logger.warning("system sampler stopped: %s: %s", type(exc).__name__, exc)
        return 1


def _own_cost() -> dict[str, float | int]:
    """What this sampler process cost, for the report's cost of profiling: CPU seconds (user + system) and
    peak resident memory. Read once, at the end."""
    try:
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {"sampler_cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "sampler_max_rss_bytes": int(ru.ru_maxrss) * 1024}
    except Exception:  # not on this platform: the report says it is not recorded
        return {}


if __name__ == "__main__":
    sys.exit(main())

