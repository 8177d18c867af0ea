"""Zero-code instrumentation: installs the profiling session the moment the job finishes importing torch
(and registers stallwatch's callbacks with training frameworks the moment they are imported), through
one-shot import hooks. A job that never imports them is left alone."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any, Callable

from stallwatch.log import warn_once

# module name -> "package.module:function" run right after that module is imported
AFTER_IMPORT: dict[str, str] = {
    "torch": "stallwatch.torch.session:install",
    "lightning.pytorch": "stallwatch.integrations.lightning:auto_register",
    "pytorch_lightning": "stallwatch.integrations.lightning:auto_register",
    "transformers.trainer": "stallwatch.integrations.transformers:auto_register",
    "keras": "stallwatch.keras.autoload:install",
}


def watch_torch_import() -> None:
    for name, target in AFTER_IMPORT.items():
        on_import(name, target)


def on_import(name: str, target: str) -> None:
    """Run `target` once `name` has been imported (now, if it already is)."""
    if name in sys.modules:
        _run(target)
        return
    watcher = next((f for f in sys.meta_path if isinstance(f, _ImportWatcher)), None)
    if watcher is None:
        watcher = _ImportWatcher()
        sys.meta_path.insert(0, watcher)
    watcher.pending[name] = target


def _run(target: str) -> None:
    try:
        module_name, _, func = target.partition(":")
        fn: Callable[[], Any] = getattr(importlib.import_module(module_name), func)
        fn()
    except Exception as exc:
        warn_once(f"autoload-{target}", "stallwatch could not instrument %s (%s: %s)", target, type(exc).__name__, exc)


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of a watched module so `target` runs right after."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if self._busy or fullname not in self.pending:
            return None
        hook = self.pending.pop(fullname)
        self._busy = True  # find_spec below walks sys.meta_path again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            try:
                loader.exec_module = original
            except Exception:
                pass
            _run(hook)

        loader.exec_module = exec_module
        return spec
