"""PyTorch profiling: automatic under `stallwatch run`, or explicit with `stallwatch.torch.profile()`.

    with stallwatch.torch.profile(out="runs/exp1") as prof:
        for batch in loader:
            with prof.step("train"):
                ...

Outside `stallwatch run`, `profile()` records the node itself (it starts the system sampler)."""

from stallwatch.torch.api import Profile, profile

__all__ = ["Profile", "profile"]
