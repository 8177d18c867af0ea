"""Private folders (`stallwatch-*` under the temporary directory: the event socket, the sampler's journal, the
job's staging folder) that a killed `stallwatch run` left behind. Each holds `owner.json` naming its run, node and
launcher; the next command on this machine that touches the run removes those whose launcher and sampler are
gone, and says so in one line with what they still held (it was never stored)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass

from stallwatch.log import logger

OWNER = "owner.json"
PREFIX = "stallwatch-"


@dataclass(frozen=True)
class Owner:
    """Who made a private folder: the run, its node, the launcher's pid and this machine's name."""

    run: str
    node: str
    pid: int
    host: str
    socket_dir: str | None = None  # the event socket's own folder, when the temporary path was too long

    def write(self, root: str) -> None:
        try:
            with open(os.path.join(root, OWNER), "w") as f:
                json.dump({"run": self.run, "node": self.node, "pid": self.pid, "host": self.host,
                           "socket_dir": self.socket_dir}, f)
        except OSError:
            pass  # no cleanup after a kill then, nothing else lost


def same_run(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def clean_leftovers(run_uri: str, *, base: str | None = None) -> list[str]:
    """Remove the private folders of `run_uri` left by launchers no longer running on this machine; returns
    them. Only folders of this user, never through a link."""
    base = base or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        root = os.path.join(base, name)
        owner = _owner(root)
        if owner is None or not same_run(owner.run, run_uri) or owner.host != socket.gethostname():
            continue
        if _alive(owner.pid) or _listening(os.path.join(owner.socket_dir or root, "events.sock")):
            continue  # its launcher runs, or its sampler finishes the node (a launcher killed: it cleans up itself)
        files, size = _contents(root)
        for path in (root, owner.socket_dir):
            if path and _ours(path):
                shutil.rmtree(path, ignore_errors=True)
        removed.append(root)
        held = f"; it held {files} file{'s' if files != 1 else ''} ({size / 1e6:.1f} MB) never stored" if files \
            else ""
        logger.warning("removed %s, left by a `stallwatch run` of node %r of this run that was killed (pid %d)%s",
                       root, owner.node, owner.pid, held)
    return removed


def _owner(root: str) -> Owner | None:
    if not _ours(root):
        return None
    try:
        fd = os.open(os.path.join(root, OWNER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = json.loads(f.read(1 << 16))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    run, node, pid, host, sock = (data.get(k) for k in ("run", "node", "pid", "host", "socket_dir"))
    if not (isinstance(run, str) and isinstance(node, str) and isinstance(host, str)
            and isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 31):
        return None
    return Owner(run, node, pid, host, sock if isinstance(sock, str) and os.path.basename(sock).startswith(PREFIX)
                 else None)


def _ours(path: str) -> bool:
    """A real directory (not a link) of this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def _alive(pid: int) -> bool:
    """The launcher (or the process of the in-job API) still runs: its folder is in use."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening(path: str) -> bool:
    """A sampler still answers on the folder's event socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(path)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _contents(root: str) -> tuple[int, int]:
    """Files (other than the owner note and the socket) and their bytes: what the folder still held."""
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n in (OWNER, "events.sock"):
                continue
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size:
                files += 1
                size += st.st_size
    return files, size
