"""Put first on the job's PYTHONPATH by `stallwatch run`: hooks PyTorch when the job imports it, then runs
the sitecustomize this one shadows (if any), so the environment's own start-up code still runs."""

import os
import sys


def _stallwatch_autoload() -> None:
    try:
        from stallwatch.torch.autoload import watch_torch_import
    except Exception:  # another interpreter, without stallwatch: the job runs unprofiled (system metrics only)
        return
    watch_torch_import()


def _chain_shadowed_sitecustomize() -> None:
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return
    with open(spec.origin, "rb") as f:
        code = compile(f.read(), spec.origin, "exec")
    exec(code, {"__name__": "sitecustomize", "__file__": spec.origin})


if os.environ.get("STALLWATCH_EVENTS"):
    try:
        _stallwatch_autoload()
    except Exception:
        pass
_chain_shadowed_sitecustomize()
