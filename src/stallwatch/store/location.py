"""A run directory on local disk or in an S3-compatible store, behind one small interface over pyarrow.fs."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

from stallwatch.log import warn_once

# Remote calls give up quickly so a dead endpoint costs seconds, not minutes; callers retry with back-off.
# The request timeout is curl's "no byte moved for this long" limit (a slow upload that makes progress is
# not cut), so a few seconds are plenty for S3 and keep a black-holed endpoint from holding a caller (the
# run summary, the node check) for long: one call costs at most attempts x timeout.
S3_CONNECT_TIMEOUT_S = 3.0
S3_REQUEST_TIMEOUT_S = 5.0
S3_MAX_ATTEMPTS = 2


_TMP_SEQ = itertools.count()


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the run root, '/'-separated
    size: int


class UnsafeFileError(OSError):
    """A path inside a run that is not a plain file of the run: a symbolic link, a FIFO or device, or a
    directory link leading out of the run. A run directory is data; stallwatch reads and writes only inside it."""


class FileTooLargeError(OSError):
    """A file bigger than its reader allows (a run's JSON is kilobytes; a crafted one could be gigabytes)."""


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


class RunLocation:
    """Where a run lives. Paths given to its methods are relative to the run root and use '/'."""

    def __init__(self, uri: str, *, patience_s: float | None = None) -> None:
        """`patience_s`: on S3, the most one request may hold its caller (under the defaults' two tries: one try, its
        timeouts cut to it): a reader beside the job (the live rules) that `--upload-timeout` bounds, as the uploads."""
        self.uri = uri.rstrip("/") or uri
        if is_remote(uri):
            scheme = uri.split("://", 1)[0]
            if scheme != "s3":
                raise ValueError(f"unsupported run location {uri!r}: use a local path or s3://bucket/prefix/run")
            # Credentials and endpoint come from the standard AWS chain (AWS_ENDPOINT_URL included).
            # Not FileSystem.from_uri: without an endpoint it asks AWS for the bucket's region over the network
            # even when AWS_REGION is set, and raises when that fails, so a run could not even start offline.
            parts = urlsplit(uri)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            if not parts.netloc:
                raise ValueError(f"run location {uri!r} names no bucket: use s3://bucket/prefix/run")
            endpoint = query.get("endpoint_override") or _endpoint_from_env()
            scheme = query.get("scheme") or _scheme_from_env()
            region = (query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                      or (None if endpoint else _resolve_region(parts.netloc)))
            self._s3 = {"endpoint": endpoint, "scheme": scheme, "region": region}
            # the defaults (two tries) hold a caller at most 2 × S3_REQUEST_TIMEOUT_S: a patience under that is one try
            patient = patience_s is None or patience_s <= 0 or patience_s >= S3_REQUEST_TIMEOUT_S * S3_MAX_ATTEMPTS
            self.fs = pafs.S3FileSystem(
                endpoint_override=endpoint,
                connect_timeout=S3_CONNECT_TIMEOUT_S if patient else min(S3_CONNECT_TIMEOUT_S, patience_s),
                request_timeout=S3_REQUEST_TIMEOUT_S if patient else min(S3_REQUEST_TIMEOUT_S, patience_s),
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS if patient else 1),
                region=region,
                scheme=scheme,
                # A small file is then one PutObject at close instead of a three-request multipart upload
                # (fewer round trips to a slow endpoint, no half-made uploads left behind by a dead one).
                allow_delayed_open=True,
            )
            self.root = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
            self.remote = True
        else:
            local = uri[len("file://"):] if uri.startswith("file://") else uri
            self.fs = pafs.LocalFileSystem()
            self.root = str(Path(local).expanduser().absolute())
            self.remote = False
        self._inside: set[str] = set()  # local directories (relative) checked to lie inside the run

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def local_path(self, rel: str = "") -> Path:
        if self.remote:
            raise ValueError(f"{self.uri} is not on local disk")
        return Path(self._abs(rel))

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Readers see the whole file or nothing: local files are renamed into place, S3 puts are atomic."""
        target = self._abs(rel)
        if self.remote:
            with self.fs.open_output_stream(target) as out:
                out.write(data)
            return
        parent = os.path.dirname(target)
        tmp = os.path.join(parent, f".{os.path.basename(target)}.{os.getpid()}.{next(_TMP_SEQ)}.tmp")
        try:
            try:
                self._check_dir(rel)
                fh = open(tmp, "xb")
            except FileNotFoundError:  # first file of its directory (cheaper than makedirs on every write)
                os.makedirs(parent, exist_ok=True)
                self._check_dir(rel)
                fh = open(tmp, "xb")
            with fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Write `rel` only if it does not exist yet; False when it already did (nothing is overwritten). On S3 a
        conditional write (If-None-Match: *), so two machines claiming one name at once cannot both win."""
        if self.remote:
            return self._s3_create_exclusive(rel, data)
        target = self._abs(rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        self._check_dir(rel)
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
            try:
                os.link(tmp, target)  # atomic, and fails if the target exists
                return True
            except FileExistsError:
                return False
            except OSError:  # a filesystem without hard links: exclusive create, then the bytes
                try:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                return True
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _s3_create_exclusive(self, rel: str, data: bytes) -> bool:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import ClientError
        except ImportError:  # without boto3 (pip install 'stallwatch[s3]') the claim is check-then-write
            warn_once("no-boto3", "boto3 is not installed: claims in %s are checked, then written, not atomic "
                      "(pip install 'stallwatch[s3]')", self.uri)
            if self.exists(rel):
                return False
            self.write_atomic(rel, data)
            return True
        bucket, _, prefix = self.root.partition("/")
        endpoint = self._s3["endpoint"]
        client = boto3.client("s3", region_name=self._s3["region"],
                              endpoint_url=f"{self._s3['scheme']}://{endpoint}" if endpoint else None,
                              config=Config(connect_timeout=S3_CONNECT_TIMEOUT_S, read_timeout=S3_REQUEST_TIMEOUT_S,
                                            retries={"max_attempts": S3_MAX_ATTEMPTS}))
        try:
            client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}" if prefix else rel, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise OSError(f"cannot create {rel} in {self.uri}: {exc}") from None
        return True

    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes; FileTooLargeError past `max_bytes`. Locally only a regular file inside the run
        is opened (never through a symbolic link, never a FIFO that would block)."""
        if self.remote:
            with self.fs.open_input_stream(self._abs(rel)) as fh:
                data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        else:
            fd = self._open_local(rel)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise FileTooLargeError(f"{rel} is larger than {max_bytes} bytes")
        return data

    def version(self, rel: str) -> tuple[int, ...] | None:
        """What changes whenever a local file is written or replaced (inode, size, change times), read
        without opening it; () when it is not there; None when unknown (remote, unreadable): read it to know."""
        if self.remote:
            return None
        try:
            st = os.lstat(self._abs(rel))
        except FileNotFoundError:
            return ()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self._abs(rel)).type != pafs.FileType.NotFound

    def list(self, rel_dir: str, recursive: bool = True) -> list[FileEntry]:
        """Files under `rel_dir` (hidden and temporary files left out); empty when it does not exist. Locally
        only the run's own regular files: links and FIFOs are skipped with one line, never followed."""
        if not self.remote:
            return self._list_local(rel_dir, recursive)
        base = self._abs(rel_dir)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=recursive))
        except FileNotFoundError:
            return []
        out = []
        prefix = self.root + "/"
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            name = info.base_name
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            out.append(FileEntry(info.path[len(prefix):] if info.path.startswith(prefix) else info.path, info.size or 0))
        return out

    def directories(self, rel_dir: str = "") -> list[str]:
        """Names of the directories directly under `rel_dir` (hidden ones left out); empty when it does not exist."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._abs(rel_dir), allow_not_found=True, recursive=False))
        except FileNotFoundError:
            return []
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and not i.base_name.startswith("."))

    def child(self, name: str) -> RunLocation:
        """The location of `name` directly under this one (a run inside a folder of runs)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not one path segment")
        base, sep, query = self.uri.partition("?")
        return RunLocation(f"{base.rstrip('/')}/{name}{sep}{query}")

    def _list_local(self, rel_dir: str, recursive: bool) -> list[FileEntry]:
        """os.scandir's file types come with the directory entries: telling links and FIFOs from files costs
        no system call, and a linked directory is never entered."""
        rel_dir = rel_dir.strip("/")
        if rel_dir:
            try:
                self._check_dir(f"{rel_dir}/-")
            except OSError as exc:
                warn_once(f"unsafe-{self.root}/{rel_dir}", "skipping %s/%s: %s", self.root, rel_dir, exc)
                return []
        out = []
        todo = [rel_dir]
        while todo:
            current = todo.pop()
            try:
                entries = os.scandir(self._abs(current))
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for entry in entries:
                    rel = f"{current}/{entry.name}" if current else entry.name
                    if entry.is_symlink() or not (entry.is_dir(follow_symlinks=False)
                                                  or entry.is_file(follow_symlinks=False)):
                        what = "a symbolic link" if entry.is_symlink() else "not a regular file (a FIFO, a socket…)"
                        warn_once(f"unsafe-{self.root}/{rel}", "skipping %s/%s: it is %s; a run holds only regular "
                                  "files", self.root, rel, what)
                    elif entry.is_dir(follow_symlinks=False):
                        if recursive:
                            todo.append(rel)
                    elif not (entry.name.startswith(".") or entry.name.endswith(".tmp")):
                        try:
                            out.append(FileEntry(rel, entry.stat(follow_symlinks=False).st_size))
                        except FileNotFoundError:  # gone since it was listed (a part compacted)
                            pass
        out.sort(key=lambda e: e.path)
        return out

    def delete(self, rel: str) -> None:
        if not self.remote:
            self._check_dir(rel)
        try:
            self.fs.delete_file(self._abs(rel))
        except FileNotFoundError:
            pass

    def open_input_file(self, rel: str):
        """A random-access file, so a Parquet reader fetches only the needed columns and row groups. Locally
        only a regular file inside the run (see `read`)."""
        if not self.remote:
            self._check_local(rel)
        return self.fs.open_input_file(self._abs(rel))

    def open_input_stream(self, rel: str):
        """A sequential stream of the file's bytes as stored (a .gz file is not decompressed), read in blocks:
        a large file is never held whole in memory."""
        return self.fs.open_input_stream(self._abs(rel), compression=None)

    # -- staying inside the run (local) -----------------------------------------------------------------
    def _real_root(self) -> str:
        return os.path.realpath(self.root)

    def _check_dir(self, rel: str) -> None:
        """`rel`'s directory lies inside the run: no component between the run and it is a link leading
        elsewhere (a crafted `rules -> /etc` must not make `stallwatch rules` write there)."""
        rel_dir = os.path.dirname(rel)
        if rel_dir in self._inside:
            return
        if os.path.realpath(self._abs(rel_dir)) != os.path.join(self._real_root(), rel_dir).rstrip("/"):
            raise UnsafeFileError(f"{rel_dir}/ leads outside the run directory {self.root} (a symbolic link); "
                                  "a run holds only plain directories and files")
        self._inside.add(rel_dir)

    def _check_local(self, rel: str) -> os.stat_result:
        """`rel` is a regular file inside the run, not a symbolic link (checked without opening it)."""
        self._check_dir(rel)
        st = os.lstat(self._abs(rel))
        _check_regular(rel, st)
        return st

    def _open_local(self, rel: str) -> int:
        """A file descriptor of `rel`, opened without following a link and without blocking on a FIFO."""
        self._check_dir(rel)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._abs(rel), flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFileError(f"{rel} is a symbolic link; a run holds only regular files") from None
            raise
        try:
            _check_regular(rel, os.fstat(fd))
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd


def _check_regular(rel: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(f"{rel} is a symbolic link; a run holds only regular files")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"{rel} is not a regular file (a FIFO, a socket or a device); a run holds only "
                              "regular files")


def _endpoint_from_env() -> str | None:
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return None
    return url.split("://", 1)[-1].rstrip("/")


def _scheme_from_env() -> str:
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return "http" if url.startswith("http://") else "https"


def _resolve_region(bucket: str) -> str | None:
    """Real AWS with no region configured: ask for the bucket's (one network call); None falls back to the SDK's."""
    try:
        return pafs.resolve_s3_region(bucket)
    except Exception as exc:
        warn_once(f"s3-region-{bucket}", "cannot find the region of bucket %s (%s); set AWS_REGION to skip this",
                  bucket, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None
