"""While the job runs: when the Hang rule names stopped ranks whose stacks of that stop are not in the run yet, ask
every process of the job for its Python stacks, once per stop, by raising `dump_stacks` in the run's config.json
(every node's sampler watches it and asks its processes: collect/stacks.py). In the launcher, never the job."""

from __future__ import annotations

from typing import Any

from stallwatch.log import logger
from stallwatch.store import run_files

RULES = ("Hang",)


class StackRequests:
    """`on_results(results)` after each live evaluation."""

    def __init__(self, location: Any) -> None:
        self.location = location
        self._asked: set[tuple[str, Any]] = set()  # (node/rank, its last progress): one request per stop
        self.requests = 0

    def on_results(self, results: list) -> None:
        for r in results:
            if r.name not in RULES or r.status != "ok":
                continue
            details = r.details if isinstance(r.details, dict) else {}
            ranks = details.get("ranks") if isinstance(details.get("ranks"), dict) else {}
            wanted = {(str(k), (ranks.get(k) or {}).get("last_progress_us")) for k in details.get("stacks_wanted") or []}
            new = wanted - self._asked
            if not new:
                continue
            self._asked |= new
            current = run_files.read_config(self.location)
            run_files.write_config(self.location, current.replace(dump_stacks=current.dump_stacks + 1))
            self.requests += 1
            logger.warning("rule %s: %s stopped making progress; asking every process of the job for its Python "
                           "stacks (stored under stacks/)", r.name, ", ".join(sorted(k for k, _ in new)))
