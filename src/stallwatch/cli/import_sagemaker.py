"""`stallwatch import-sagemaker SRC`: a SageMaker Debugger profiler output as a run."""

from __future__ import annotations

import argparse


def cmd_import_sagemaker(args: argparse.Namespace) -> int:
    """Turn a SageMaker Debugger profiler output into a run (the logic lives in stallwatch.importers.sagemaker)."""
    from stallwatch.importers.sagemaker.command import run_import

    return run_import(args.source, args.out)
