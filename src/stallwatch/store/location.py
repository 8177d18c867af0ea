"""A run directory on local disk or in an S3-compatible store, behind one small interface over pyarrow.fs."""

from __future__ import annotations

import itertools
import os
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


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


class RunLocation:
    """Where a run lives. Paths given to its methods are relative to the run root and use '/'."""

    def __init__(self, uri: str) -> None:
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
            self.fs = pafs.S3FileSystem(
                endpoint_override=endpoint,
                connect_timeout=S3_CONNECT_TIMEOUT_S,
                request_timeout=S3_REQUEST_TIMEOUT_S,
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS),
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
                fh = open(tmp, "wb")
            except FileNotFoundError:  # first file of its directory (cheaper than makedirs on every write)
                os.makedirs(parent, exist_ok=True)
                fh = open(tmp, "wb")
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

    def read(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self._abs(rel)) as fh:
            return fh.read()

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self._abs(rel)).type != pafs.FileType.NotFound

    def list(self, rel_dir: str, recursive: bool = True) -> list[FileEntry]:
        """Files under `rel_dir` (hidden and temporary files left out); empty when it does not exist."""
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

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self._abs(rel))
        except FileNotFoundError:
            pass

    def open_input_file(self, rel: str):
        """A random-access file, so a Parquet reader fetches only the needed columns and row groups."""
        return self.fs.open_input_file(self._abs(rel))

    def open_input_stream(self, rel: str):
        """A sequential stream of the file's bytes as stored (a .gz file is not decompressed), read in blocks:
        a large file is never held whole in memory."""
        return self.fs.open_input_stream(self._abs(rel), compression=None)


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
