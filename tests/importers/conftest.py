"""Fixtures of the importer tests; the S3 server ones live in tests/store/s3_server.py."""

from tests.store.s3_server import bucket, s3_env, s3_server  # noqa: F401  (pytest fixtures)
