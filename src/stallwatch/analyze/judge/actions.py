"""What happens when a rule fires during a run: log it (always), run a command, POST the result to a URL,
or stop training gracefully. Each action runs once per rule, when the rule first fires; none can block
or fail the evaluation (commands and notifications run in the background, bounded)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Any

from stallwatch.config import ProfilerConfig
from stallwatch.log import logger, warn_once
from stallwatch.store import run_files

NOTIFY_TIMEOUT_S = 10.0
STACKS_GRACE_S = 30.0
ENDS_HUNG_JOB = ("Hang",)  # stop_training for these ends the job: it cannot reach a step boundary
COMMAND_TIMEOUT_S = 300.0


class RuleActions:
    """`on_results(results)` after each evaluation; actions fire for the rules whose count went from 0 up."""

    def __init__(self, config: ProfilerConfig, location: Any) -> None:
        self.location = location
        self.actions: dict[str, list[str]] = {}
        for text in config.rule_actions:
            rule, _, action = text.partition("=")
            self.actions.setdefault(rule.strip().lower(), []).append(action.strip())
        self._fired: set[str] = set()
        self.done: list[tuple[str, str]] = []  # (rule, action) taken, in order
        self._threads: list[threading.Thread] = []
        self._waiting: dict[str, float] = {}  # rule -> when it first fired while waiting for stacks (monotonic s)
        self.live = False  # the job is running under this launcher (`stallwatch run`): a hung one can be ended

    def on_results(self, results: list) -> None:
        for r in results:
            if r.triggered <= 0 or r.name in self._fired or self._awaits_stacks(r):
                continue
            self._fired.add(r.name)
            logger.warning("rule %s triggered (%d): %s", r.name, r.triggered, _first_sentence(r.recommendation))
            for action in self.actions.get(r.name.lower(), []):
                try:
                    self._take(action, r)
                    self.done.append((r.name, action))
                except Exception as exc:
                    warn_once(f"action-{r.name}-{action}", "rule %s: action %s failed (%s: %s)",
                              r.name, action, type(exc).__name__, exc)

    def _awaits_stacks(self, result: Any) -> bool:
        """A live Hang whose stopped ranks' stacks are not in the run yet: its actions (which may end the job) wait
        for them, up to STACKS_GRACE_S after it first fired."""
        if result.name not in ENDS_HUNG_JOB or not self.live:
            return False
        from stallwatch.analyze.rules.hang import HangDetails

        try:
            wanted = HangDetails.from_json(result.details).stacks_wanted
        except (KeyError, TypeError, ValueError):
            return False
        if not wanted:
            return False
        first = self._waiting.setdefault(result.name, time.monotonic())
        return time.monotonic() - first < STACKS_GRACE_S

    def _take(self, action: str, result: Any) -> None:
        if action == "log":
            return  # said above
        if action == "stop_training":
            self._stop_training(result)
        elif action.startswith("command:"):
            self._command(action[len("command:"):].strip(), result)
        elif action.startswith("notify:"):
            self._notify(action[len("notify:"):].strip(), result)

    def _stop_training(self, result: Any) -> None:
        """Through the run's live configuration: the job stops at its next step boundary, and the reason
        stays in config.json and in the job's framework events."""
        reason = f"rule {result.name} triggered: {_first_sentence(result.recommendation)}"
        current = run_files.read_config(self.location)
        if current.stop_training:
            return
        run_files.write_config(self.location, current.replace(stop_training=reason))
        logger.warning("asked the job to stop training (%s)", reason)
        if result.name in ENDS_HUNG_JOB and self.live:
            # A hung job never reaches the step boundary where it would stop: the launcher (this process) is sent
            # SIGTERM, which it forwards to the job after the job's events are flushed, as `kill` would.
            logger.warning("the job is hung: ending it (SIGTERM, forwarded by stallwatch run)")
            os.kill(os.getpid(), signal.SIGTERM)

    def _command(self, command: str, result: Any) -> None:
        rel = run_files.rule_result_path(result.name)
        env = dict(os.environ, STALLWATCH_RULE=result.name, STALLWATCH_RULE_TRIGGERED=str(result.triggered),
                   STALLWATCH_RULE_RESULT=json.dumps(result.to_json(), default=str)[:100_000],
                   STALLWATCH_RULE_FILE=rel)
        proc = subprocess.Popen(command, shell=True, env=env, stdin=subprocess.DEVNULL)
        threading.Thread(target=_reap, args=(proc, command), daemon=True).start()

    def _notify(self, url: str, result: Any) -> None:
        body = json.dumps(result.to_json(), default=str).encode()

        def post() -> None:
            try:
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"},
                                             method="POST")
                with urllib.request.urlopen(req, timeout=NOTIFY_TIMEOUT_S) as resp:
                    resp.read(1024)
            except Exception as exc:
                warn_once(f"notify-{url}", "rule %s: notifying %s failed (%s)", result.name, url, exc)

        thread = threading.Thread(target=post, name="stallwatch-notify", daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self, timeout_s: float = NOTIFY_TIMEOUT_S) -> None:
        """Let pending notifications finish (at the end of the run)."""
        for t in list(self._threads):
            t.join(timeout_s)


def _reap(proc: subprocess.Popen, command: str) -> None:
    try:
        code = proc.wait(COMMAND_TIMEOUT_S)
        if code:
            logger.warning("rule action command %r exited with %d", command, code)
    except subprocess.TimeoutExpired:
        proc.kill()
        logger.warning("rule action command %r ran over %.0f s and was stopped", command, COMMAND_TIMEOUT_S)


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]
