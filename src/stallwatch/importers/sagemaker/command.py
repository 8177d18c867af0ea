"""The `stallwatch import-sagemaker` command: run the import, print what it did, turn failures into one line."""

from __future__ import annotations

import sys

from stallwatch.importers.sagemaker.importer import SourceError, import_sagemaker
from stallwatch.store.run_writer import RunExistsError


def run_import(source: str, out: str | None, runs_dir: str = "stallwatch-runs") -> int:
    """0: imported (losses, if any, are listed); 2: a bad source or destination; 1: the import failed midway
    (what was written stays; the message says what to do)."""
    from stallwatch.present.progress import Progress

    try:
        with Progress("import", unit="files") as bar:
            summary = import_sagemaker(source, out, runs_dir=runs_dir, progress=bar.update)
    except (SourceError, RunExistsError) as exc:
        print(f"stallwatch import-sagemaker: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. an --out URI that is not a local path or s3://
        print(f"stallwatch import-sagemaker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"stallwatch import-sagemaker: the import stopped ({type(exc).__name__}: {exc}); what was written "
              "so far is kept, but the run is incomplete: remove it and run the command again", file=sys.stderr)
        return 1
    print(summary.text())
    print(summary.out)
    return 0
