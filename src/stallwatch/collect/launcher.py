"""`stallwatch run -- CMD`: create the run, start the sampler process, run CMD under it, stop cleanly.

The command gets its own process group. In an interactive terminal that group is made the foreground
one, so Ctrl-C reaches the job (and its data-loader workers) exactly as without stallwatch, while the
sampler, in its own session, keeps sampling until the job has ended. Signals sent to the launcher itself
are forwarded to the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from stallwatch.collect import leftovers
from stallwatch.collect.events import ENV_ACKS, ENV_CONFIG, ENV_EVENTS, ENV_STAGING
from stallwatch.collect.node_name import clean, default_node_name, fallback_names
from stallwatch.collect.oom_watch import OomWatch
from stallwatch.collect.sampler_process import EXIT_KEPT_IN_SPOOL, StartMessage, default_spool
from stallwatch.config import ProfilerConfig
from stallwatch.log import logger
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.timeutil import now_us

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Signals that kill a Python process at their default disposition, with no exit hook run: before forwarding one,
# the job's processes are asked to send their framework events now (their sender ships every 0.2 s otherwise).
FLUSH_BEFORE = (signal.SIGTERM, signal.SIGHUP)
FLUSH_ANSWER_S = 1.0  # the sampler answers within its own wait (0.5 s); a sampler that does not is not waited for
SAMPLER_READY_TIMEOUT_S = 15.0
MAX_SAMPLER_RESTARTS = 3
REMOTE_CHECK_TIMEOUT_S = 2.0
CLAIM_PATIENCE_S = 10.0  # a slow store's answer to a node-name claim, waited for before the job starts
ENV_AUTO = "STALLWATCH_AUTO"  # "0": no automatic PyTorch instrumentation (the explicit API still works)
AUTOLOAD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_autoload")


class RunConflictError(RuntimeError):
    """The run already holds data of this node; nothing was started and nothing was changed."""


@dataclass
class LaunchResult:
    run_uri: str
    node: str
    exit_code: int
    start_us: int
    end_us: int
    sampler_restarts: int = 0
    notes: list[str] = field(default_factory=list)
    # Where this node's data can be read when it could not all be uploaded (the local spool).
    local_copy: str | None = None
    exit_signal: str | None = None  # the signal that ended the command ("SIGTERM"), None when it exited
    interrupted: bool = False  # SIGINT/SIGTERM/SIGHUP/SIGQUIT were forwarded to it: it was asked to stop


def resolve_run_uri(config: ProfilerConfig) -> str:
    if config.out:
        return config.out.rstrip("/")
    return os.path.join(config.runs_dir, layout.new_run_id())


def versions() -> dict[str, str]:
    from stallwatch import __version__

    out = {"python": sys.version.split()[0], "stallwatch": __version__}  # the code running, not the metadata
    for dist in ("psutil", "pyarrow", "numpy", "nvidia-ml-py", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def job_environment(run_uri: str, node: str, run_id: str, config: ProfilerConfig | None = None,
                    events_address: str | None = None, staging_dir: str | None = None) -> dict[str, str]:
    """What the framework hooks inside the job read to find their run and the sampler. With a sampler
    to talk to, stallwatch's sitecustomize goes first on PYTHONPATH: it hooks PyTorch when the job
    imports it (zero code changes)."""
    env = dict(os.environ)
    for name in (ENV_EVENTS, ENV_STAGING, ENV_CONFIG, ENV_ACKS):
        env.pop(name, None)  # never an outer run's
    env.update(STALLWATCH_RUN=run_uri, STALLWATCH_NODE=node, STALLWATCH_RUN_ID=run_id)
    if events_address:
        env[ENV_EVENTS] = events_address
        env[ENV_ACKS] = "1"  # this sampler acknowledges what it journaled (collect/acks.py)
        env[ENV_CONFIG] = json.dumps((config or ProfilerConfig()).to_dict())
        if staging_dir:
            env[ENV_STAGING] = staging_dir
        if env.get(ENV_AUTO, "1") != "0":
            paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != AUTOLOAD_DIR]
            env["PYTHONPATH"] = os.pathsep.join([AUTOLOAD_DIR, *paths])
    return env


class _SamplerHandle:
    """The sampler child process and its stdin control channel."""

    def __init__(self, start: StartMessage) -> None:
        self.start = start
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stallwatch.collect.sampler_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )
        self.send(start.to_json())
        self.ready_seen = False

    def flush_job(self) -> None:
        """Ask the job's processes to send their events now, and wait (bounded) until they have: a signal that
        kills them at its default is about to be forwarded. Only once the sampler has said it is ready (its
        stdout then carries nothing else)."""
        if not self.ready_seen or not self.alive:
            return
        self.send(json.dumps({"flush": 1}))
        self.wait_ready(FLUSH_ANSWER_S, b"flushed\n")

    def send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died; the watcher restarts it

    def wait_ready(self, timeout_s: float, token: bytes = b"ready\n") -> bool:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 64)
            if not chunk:
                return False
            buf += chunk
            if token in buf:
                self.ready_seen = True
                return True
        return False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Release the pipes of a sampler that has exited."""
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def stop(self, timeout_s: float) -> bool:
        """Close the lifeline (the sampler flushes and exits); terminate it if it overstays. True when it
        exited by itself (whatever its code)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            logger.warning("the system sampler did not finish within %.0f s; stopping it", timeout_s)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return False


def claim_node(location: RunLocation, node: str, record: dict[str, Any], *, explicit: bool,
               patience_s: float = CLAIM_PATIENCE_S) -> str:
    """Claim `nodes/<node>.json` atomically (an exclusive create, locally and on S3); a run never gets two
    samplers for one node. A name given with --node that is taken is resumed as a new attempt when its earlier
    attempt has ended (a requeued job: `record` gets `attempt` and `attempts`, see `attempts`); a default name
    that is taken (two machines with one host name) moves on to the next free one. A store that does not answer
    within `patience_s`, or a --node name whose attempt still looks alive, gets a name no other machine can
    take (host, pid, random), said so: the job always runs, and a node never writes under a name it has not
    claimed. Returns the name the node writes under."""
    for name in [node] + ([] if explicit else fallback_names(node)):
        claimed = _create(location, layout.node_json(name), json.dumps({**record, "node": name}, indent=2,
                                                                       sort_keys=True).encode(), patience_s)
        if claimed is None:
            if explicit:  # the user's own name: theirs to keep distinct, as they asked
                logger.warning("could not claim node %r in %s in %.0f s; writing under it as --node says",
                               name, location.uri, patience_s)
                return name
            return _unique(location, node, f"could not claim node name {name!r} in {location.uri} in "
                                           f"{patience_s:.0f} s")
        if claimed:
            if name != node:
                logger.warning("node name %r is taken in %s; this machine is %r", node, location.uri, name)
            return name
        if explicit:
            return _resume(location, node, record, patience_s)
    raise RunConflictError(f"run {location.uri} has no free node name like {node!r}; pass --node NAME for another "
                           "machine of this run, or a new --out for a new run")


def _resume(location: RunLocation, node: str, record: dict[str, Any], patience_s: float) -> str:
    """`node` is in the run already: a new attempt of it when the earlier one has ended, else a unique name."""
    from stallwatch.collect import attempts

    earlier = attempts.earlier_record(location, node)
    why = "its record cannot be read" if earlier is None else attempts.still_running(location, node, earlier)
    if why is not None:
        return _unique(location, node, f"run {location.uri} has node {node!r} and it may still be running ({why})")
    plan = attempts.resume_plan(earlier)
    taken = _create(location, attempts.attempt_claim(node, plan.attempt), b"", patience_s)
    if not taken:
        return _unique(location, node, f"attempt {plan.attempt} of node {node!r} in {location.uri} was "
                                       "claimed by another machine" if taken is False else
                                       f"could not claim attempt {plan.attempt} of node {node!r} in {location.uri}")
    last = plan.earlier[-1]
    ended = (f"ended with exit code {last['exit_code']}" if isinstance(last.get("exit_code"), int)
             else "ended without recording its end")
    logger.warning("node %r of run %s resumed as attempt %d (attempt %d %s); its data joins the node's",
                   node, location.uri, plan.attempt, plan.attempt - 1, ended)
    record.update(attempt=plan.attempt, attempts=plan.earlier, attempt_start_us=record["start_us"])
    if plan.first_start_us is not None:
        record["start_us"] = min(plan.first_start_us, record["start_us"])
    return node


def _unique(location: RunLocation, node: str, why: str) -> str:
    unique = clean(f"{node[:100]}-{os.getpid()}-{secrets.token_hex(3)}")
    logger.warning("%s; this machine is %r, a name no other machine takes", why, unique)
    return unique


def _create(location: RunLocation, rel: str, data: bytes, patience_s: float) -> bool | None:
    """`location.create_exclusive`; on a remote store waited for up to `patience_s` (polled with backoff): None
    when it did not answer in time or failed. A claim that lands after we gave up is taken back, so no name is
    held by a machine that writes under another."""
    if not location.remote:
        return location.create_exclusive(rel, data)
    found: dict[str, Any] = {}
    lock = threading.Lock()

    def attempt() -> None:
        try:
            created = location.create_exclusive(rel, data)
        except Exception as exc:
            found["error"] = exc
            return
        with lock:
            found["created"] = created
            late = found.get("abandoned", False)
        if late and created:
            with contextlib.suppress(Exception):
                location.delete(rel)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    deadline, wait = time.monotonic() + max(patience_s, REMOTE_CHECK_TIMEOUT_S), 0.05
    while t.is_alive() and time.monotonic() < deadline:
        t.join(min(wait, max(0.0, deadline - time.monotonic())))
        wait = min(wait * 2, 1.0)
    with lock:
        if "created" in found:
            return bool(found["created"])
        found["abandoned"] = True
    logger.warning("could not claim %s in %s (%s); the data is spooled locally until it answers",
                   rel, location.uri, found.get("error", "no answer in time"))
    return None


def _first_files(location: RunLocation, run_record: dict[str, Any], config: ProfilerConfig) -> dict[str, str]:
    """run.json and config.json: created by the first node of a run; later nodes leave them as they are."""
    files = {layout.RUN_JSON: json.dumps(run_record, indent=2, sort_keys=True),
             layout.CONFIG_JSON: config.to_json()}
    if location.remote:
        return files  # written by the sampler through its spool, so a dead endpoint cannot block the start
    for rel, text in files.items():
        location.create_exclusive(rel, text.encode())
    return {}


def _preexec_own_group(take_terminal: bool):
    def fn() -> None:
        os.setpgid(0, 0)
        if take_terminal:
            _give_terminal(os.getpgrp())
    return fn


def _we_own_terminal() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except (OSError, ValueError):
        return False


def _give_terminal(pgid: int) -> None:
    """Make `pgid` the terminal's foreground group (SIGTTOU ignored: we may be in the background)."""
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _start_sampler(start: StartMessage, *, wait: bool = True) -> _SamplerHandle | None:
    """The sampler process; with `wait`, once it says it is ready (else the caller checks `ready()` later:
    the job need not wait for it, its events are kept until the sampler's socket answers)."""
    try:
        sampler = _SamplerHandle(start)
    except OSError as exc:  # cannot even start a process (out of pids, fds, memory): the job still runs
        logger.error("cannot start the system sampler (%s); the command runs without it", exc.strerror or exc)
        return None
    if wait:
        _check_ready(sampler)
    return sampler


def _check_ready(sampler: _SamplerHandle) -> None:
    if not sampler.wait_ready(SAMPLER_READY_TIMEOUT_S):
        logger.warning("the system sampler did not start in time; the command runs anyway")


def _wait_step(child: subprocess.Popen, take_terminal: bool, poll_s: float = 0.5) -> bool:
    """Wait up to `poll_s` for the job; True once it has exited. When Ctrl-Z stops the job, the launcher
    stops too, so the shell gets its prompt back; `fg` resumes both and hands the terminal back."""
    deadline = time.monotonic() + poll_s
    while True:
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:  # already reaped elsewhere
            return child.poll() is not None
        if pid and os.WIFSTOPPED(status):
            if take_terminal:  # interactive job control; elsewhere whoever stopped the job resumes it
                _give_terminal(os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)  # the shell sees its job stop
                _give_terminal(child.pid)  # resumed by fg
                try:
                    os.killpg(child.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            continue
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        exit_fd = _exit_fd(child)
        if exit_fd is None:
            time.sleep(min(0.1, left))
        else:  # wakes the moment the job exits; a stop (Ctrl-Z) is seen within 0.1 s
            select.select([exit_fd], [], [], min(0.1, left))


def _exit_fd(child: subprocess.Popen) -> int | None:
    """A pidfd of the job (readable once it exits): `stallwatch run` returns as soon as the job ends, not at
    the next poll. None where the kernel has none (before Linux 5.3)."""
    fd = getattr(child, "_stallwatch_exit_fd", False)
    if fd is False:
        try:
            fd = os.pidfd_open(child.pid)
        except (AttributeError, OSError):
            fd = None
        child._stallwatch_exit_fd = fd  # type: ignore[attr-defined]
    return fd


def launch(command: list[str], config: ProfilerConfig,
           on_job_started: Callable[[], None] | None = None) -> LaunchResult:
    """Run `command` under the sampler; returns once it has ended and the sampler has flushed.
    `on_job_started` is called once the job runs: what reads the store beside it (the live rules) starts then,
    so that a store that does not answer never holds the job's start.

    Only a node-name conflict (RunConflictError) stops the command from running: a run directory that
    cannot be written (full disk, bad location) is logged and the command runs anyway."""
    # The framework-event socket and the staging folder live in a private directory (0700) that outlives
    # sampler restarts.
    dirs = PrivateDirs.make()
    try:
        return _launch(command, config, dirs, on_job_started)
    finally:
        dirs.remove()


SOCKET_NAME = "events.sock"
MAX_SOCKET_PATH = 100  # a Unix socket's path must fit in 108 bytes (sun_path), its final NUL included


@dataclass(frozen=True)
class PrivateDirs:
    """Where a node's job and sampler meet (0700, outliving sampler restarts): `root` holds the staging
    folder; `socket` the event socket and the sampler's journal — `root` itself unless the temporary
    directory's path is too long for a socket; None when no directory can hold one."""

    root: str
    socket: str | None

    @classmethod
    def make(cls) -> PrivateDirs:
        root = tempfile.mkdtemp(prefix="stallwatch-")
        return cls(root, _socket_dir(root))

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        if self.socket is not None and self.socket != self.root:
            shutil.rmtree(self.socket, ignore_errors=True)


def _socket_dir(private_dir: str) -> str | None:
    """Where the event socket can live: the private directory, or, when the temporary directory's path is
    too long for a Unix socket, a private (0700) directory under a short one; None when there is none."""
    def fits(d: str) -> bool:
        return len(os.fsencode(os.path.join(d, SOCKET_NAME))) <= MAX_SOCKET_PATH

    if fits(private_dir):
        return private_dir
    for base in (os.environ.get("XDG_RUNTIME_DIR"), "/tmp", "/var/tmp", "/dev/shm"):
        if not base or not fits(os.path.join(base, "stallwatch-xxxxxxxx")):
            continue
        try:
            return tempfile.mkdtemp(prefix="stallwatch-", dir=base)
        except OSError:
            continue
    logger.warning("the temporary directory's path is too long for the framework-event socket and no short "
                   "one is writable (/tmp, /var/tmp, /dev/shm); framework profiling is off. Set TMPDIR to a "
                   "shorter path")
    return None


@dataclass
class NodeSession:
    """A node of a run being recorded: its sampler process and what the job's processes need to know."""

    run_uri: str
    run_id: str
    node: str
    start_us: int
    start: StartMessage
    sampler: _SamplerHandle | None
    config: ProfilerConfig

    def job_environment(self) -> dict[str, str]:
        """The environment of a job recorded by this node (framework hooks find the sampler through it)."""
        return job_environment(self.run_uri, self.node, self.run_id, self.config,
                               self.start.events_address if self.sampler is not None else None,
                               self.start.staging_dir)

    def finish(self, exit_code: int, end_us: int, *, exit_signal: str | None = None,
               interrupted: bool = False, oom_kills: int | None = None,
               memory_limit_bytes: int | None = None, memory_peak_bytes: int | None = None) -> str | None:
        """Tell the sampler how the job ended (recorded in the node record) and wait for its last flush; the
        local spool path when some of the data could not be uploaded."""
        if self.sampler is None:
            return None
        ended: dict = {"exit": exit_code, "end_us": end_us, "signal": exit_signal, "interrupted": interrupted}
        if oom_kills is not None:  # the kernel's OOM killer in the job's memory cgroup (collect/oom_watch.py)
            ended.update(oom_kills=oom_kills, memory_limit_bytes=memory_limit_bytes, memory_peak_bytes=memory_peak_bytes)
        end = json.dumps(ended)
        self.sampler.send(end)
        by_itself = self.sampler.stop(timeout_s=self.config.flush_interval_s + self.config.upload_timeout_s + 15)
        code = self.sampler.proc.returncode
        if by_itself and code not in (0, EXIT_KEPT_IN_SPOOL):
            # Killed (or crashed) at the end, before its last flush: what it had received is in its journal.
            # A sampler started once more replays it into the run and records how the job ended (one that
            # overstayed and was stopped is not started again: it would overstay again).
            logger.warning("the system sampler exited (code %s) before its last flush; finishing with a new one",
                           code)
            self.sampler.close()
            self.sampler = _start_sampler(self.start)
            if self.sampler is None:
                return None
            self.sampler.send(end)
            self.sampler.stop(timeout_s=self.config.flush_interval_s + self.config.upload_timeout_s + 15)
            code = self.sampler.proc.returncode
        if code == EXIT_KEPT_IN_SPOOL:
            return default_spool(self.run_uri, self.node)
        return None


def start_node(command: list[str], config: ProfilerConfig, dirs: PrivateDirs, *,
               wait_for_sampler: bool = True) -> NodeSession:
    """Create (or join) the run, claim this node and start its sampler. Raises RunConflictError only."""
    run_uri = resolve_run_uri(config)
    run_id = os.path.basename(run_uri.rstrip("/")) or run_uri
    node = config.node or default_node_name(command)
    start_us = now_us()
    node_record = {"node": node, "start_us": start_us, "end_us": None, "command": command,
                   "cwd": os.getcwd(), "status": "starting"}
    run_record = {"format_version": 1, "run_id": run_id, "created_us": start_us, "created_by_node": node,
                  "command": command, "versions": versions(), "config": config.to_dict()}
    files: dict[str, str] = {}
    try:
        location: RunLocation | None = RunLocation(run_uri)
    except ValueError as exc:  # e.g. an unsupported URI scheme: nothing can be stored there
        logger.error("%s; the command runs without profiling", exc)
        location = None
    if location is not None:
        try:
            node = claim_node(location, node, node_record, explicit=config.node is not None,
                              patience_s=min(CLAIM_PATIENCE_S, max(REMOTE_CHECK_TIMEOUT_S, config.upload_timeout_s)))
            node_record["node"] = run_record["created_by_node"] = node
            files = _first_files(location, run_record, config)
        except RunConflictError:
            raise
        except OSError as exc:  # a full disk, a read-only or missing mount: sample anyway, the writer degrades
            logger.warning("cannot write the run directory %s (%s); the command runs, samples are stored "
                           "once it can be written", run_uri, exc.strerror or exc)
    staging = os.path.join(dirs.root, "staging")
    os.makedirs(staging, exist_ok=True)
    leftovers.clean_leftovers(run_uri)  # what a killed launcher of this run left on this machine
    owner_run = run_uri if "://" in run_uri else os.path.abspath(run_uri)
    leftovers.Owner(owner_run, node, os.getpid(), socket.gethostname(),
                    dirs.socket if dirs.socket not in (None, dirs.root) else None).write(dirs.root)
    start = StartMessage(run=run_uri, node=node, sample_interval_ms=config.sample_interval_ms,
                         flush_interval_s=config.flush_interval_s, max_storage_bytes=config.max_storage_bytes,
                         gpu=config.gpu, node_record=node_record, upload_timeout_s=config.upload_timeout_s,
                         files=files, events_address=None if dirs.socket is None else os.path.join(dirs.socket, SOCKET_NAME),
                         staging_dir=staging, config=config.to_dict())
    sampler = _start_sampler(start, wait=wait_for_sampler) if location is not None else None
    start.files = {}  # a restarted sampler must not rewrite them
    return NodeSession(run_uri, run_id, node, start_us, start, sampler, config)


def _launch(command: list[str], config: ProfilerConfig, dirs: PrivateDirs,
            on_job_started: Callable[[], None] | None = None) -> LaunchResult:
    # The job starts while the sampler starts (it keeps its events until the sampler answers).
    session = start_node(command, config, dirs, wait_for_sampler=False)
    run_uri, node, start_us, start, sampler = session.run_uri, session.node, session.start_us, session.start, session.sampler

    # Signals are forwarded from before the job starts: one that arrives while it is being started is
    # delivered to it right after, instead of killing the launcher and orphaning the job.
    child: subprocess.Popen | None = None
    pending: list[int] = []
    received: set[int] = set()  # signals forwarded to the job: it was asked to stop (recorded as interrupted)

    flushing: list[bool] = []

    def forward(signum: int, _frame: Any) -> None:
        received.add(signum)
        if child is None:
            pending.append(signum)
            return
        if signum in FLUSH_BEFORE and sampler is not None and not flushing and child.poll() is None:
            flushing.append(True)  # a second signal meanwhile is forwarded at once
            try:
                sampler.flush_job()
            except Exception:
                pass
            finally:
                flushing.clear()
        try:
            if signum == signal.SIGINT:
                os.killpg(child.pid, signum)  # as a terminal would: the job and its workers
            else:
                child.send_signal(signum)
        except ProcessLookupError:
            pass

    take_terminal = _we_own_terminal()
    # A signal the launcher was started with ignored (nohup's SIGHUP, SIGINT for a background job) stays
    # ignored, for the job too: it inherits the disposition, exactly as without stallwatch.
    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    restarts, gave_up = 0, False
    try:
        try:
            env = session.job_environment()
            child = subprocess.Popen(command, env=env,
                                     preexec_fn=_preexec_own_group(take_terminal))
        except OSError as exc:
            # as a shell says it: 126 found but cannot be executed, 127 not found
            code = 126 if isinstance(exc, PermissionError) else 127
            logger.error("cannot run %s: %s", command[0], exc.strerror or exc)
            end_us = now_us()
            session.finish(code, end_us)
            return LaunchResult(run_uri, node, code, start_us, end_us)
        if sampler is not None:
            sampler.send(json.dumps({"pid": child.pid}))
        for signum in pending:
            forward(signum, None)
        if on_job_started is not None:
            try:
                on_job_started()
            except Exception as exc:  # the job runs whatever its followers do
                logger.warning("could not start following the run (%s: %s)", type(exc).__name__, exc)
        if sampler is not None:
            _check_ready(sampler)
        oom = OomWatch()  # kills by the kernel's OOM killer in the job's memory cgroup (collect/oom_watch.py)
        while True:
            oom.look(child.pid)
            if _wait_step(child, take_terminal):
                break
            if sampler is not None and not sampler.alive and restarts == MAX_SAMPLER_RESTARTS and not gave_up:
                gave_up = True  # said once: the job's processes keep their events and stage them at their exit
                logger.warning("the system sampler exited (code %s) after %d restarts; not restarted: no system "
                               "samples from now on, and the job's framework events are kept by its processes "
                               "and stored when it ends", sampler.proc.returncode, MAX_SAMPLER_RESTARTS)
            if sampler is not None and not sampler.alive and restarts < MAX_SAMPLER_RESTARTS:
                restarts += 1
                logger.warning("the system sampler exited (code %s); restarting it (%d of %d)",
                               sampler.proc.returncode, restarts, MAX_SAMPLER_RESTARTS)
                sampler.close()
                sampler = session.sampler = _start_sampler(start)
                if sampler is not None:
                    sampler.send(json.dumps({"pid": child.pid}))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if take_terminal:
            _give_terminal(os.getpgrp())
    end_us = now_us()
    code = child.returncode
    exit_code = 128 - code if code < 0 else code
    exit_signal = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
    asked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT} & received
    local_copy = session.finish(exit_code, end_us, exit_signal=exit_signal, interrupted=bool(asked),
                                oom_kills=oom.kills(), memory_limit_bytes=oom.limit, memory_peak_bytes=oom.peak())
    return LaunchResult(run_uri, node, exit_code, start_us, end_us, sampler_restarts=restarts,
                        local_copy=local_copy, exit_signal=exit_signal, interrupted=bool(asked))
