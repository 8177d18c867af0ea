"""`stallwatch run`'s rules: followed live in a background thread of the launcher (local or S3 runs) every
`rules_interval_s`, and evaluated once more on the rest when the job has ended; the results are written into
the run (`rules/`) and acted on. Nothing here can fail the job or the launcher.

The custom rules evaluated here are those of the configuration the person at the command line gave
(`--custom-rule`, or their own `--config` file): never the ones a run directory names."""

from __future__ import annotations

import threading
from typing import Any

from stallwatch.analyze.results import RuleResult
from stallwatch.config import ProfilerConfig
from stallwatch.log import warn_once
from stallwatch.timeutil import now_us

FINISH_TIMEOUT_S = 120.0  # a local run's last evaluation (a remote run's is bounded by its upload timeout)
STACKS_SOON_S = 2.0  # asked for, the stacks are in the run within about a second (the sampler's poll, the sender's)


class RulesNotFinished(RuntimeError):
    """The rules' last evaluation on a remote run did not end within the time the user gave (`--upload-timeout`):
    the launcher does not hold the job's allocation for a slow store; `stallwatch rules` evaluates them later."""


class LiveRules:
    def __init__(self, config: ProfilerConfig) -> None:
        self.config = config
        self.uri = config.out or ""
        self.actions: Any = None
        self.escalation: Any = None
        self.stacks: Any = None
        self._asked_stacks = False  # the last evaluation asked the job for its stacks: evaluate again soon
        self.interval_s = config.rules_interval_s
        self._stop = threading.Event()
        self._created_us = now_us()
        self._results: list[RuleResult] | None = None
        self._thread: threading.Thread | None = None
        self.rules = self._rules()  # loaded once, on the caller's thread, before the job starts
        self.params = self._params()

    def start(self) -> None:
        """Follow the run, once its job runs (`launch(on_job_started=…)`): its reads of a store that does not
        answer held the launcher's own first request to the store, and so the job's start, by 10 s."""
        if self.interval_s > 0 and self._thread is None and not self._stop.is_set():
            # local and S3 runs alike: each evaluation reads only the new files
            self._thread = threading.Thread(target=self._follow, name="stallwatch-rules", daemon=True)
            self._thread.start()

    def cancel(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def finish(self, uri: str) -> list[RuleResult]:
        """After the job: the last evaluation, written into the run and acted on; the results. Raises what
        made the rules impossible to evaluate (the caller says it in one line)."""
        self._stop.set()
        remote = "://" in (self.uri or uri)  # followed on the store, even when `uri` is the local spool's copy
        wait_s = self.config.upload_timeout_s if remote else FINISH_TIMEOUT_S
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive() and remote and uri == self.uri:
                raise RulesNotFinished(
                    f"the rules' last evaluation did not finish within --upload-timeout {wait_s:g} s ({uri} answers "
                    f"slowly); the results so far are in the run, `stallwatch rules {uri}` evaluates them all")
        results = self._results
        if results is None:  # no live evaluation (disabled, or it failed): one batch evaluation
            from stallwatch.analyze.judge.feed import iter_run
            from stallwatch.analyze.judge.runner import evaluate
            from stallwatch.store.reader import open_run

            run = open_run(uri)
            results = evaluate(self.rules, iter_run(run, self.rules), self.params)
            _write(run, results)
            self._act(run, results)
        if self.actions is not None:
            self.actions.wait()
        return results

    def _follow(self) -> None:
        try:
            from stallwatch.analyze.judge.live import follow
            from stallwatch.store.reader import RunNotFoundError, open_run

            run = None
            while not self._stop.is_set():  # until this launch has claimed its node in the run
                try:
                    # on a store, each request bounded as the uploads are: one that never returns holds no exit
                    run = open_run(self.uri, patience_s=self.config.upload_timeout_s if "://" in self.uri else None)
                    if any((n.get("start_us") or 0) >= self._created_us for n in run.info["nodes"].values()):
                        break
                except RunNotFoundError:
                    pass
                self._stop.wait(0.5)
            else:
                return  # ended before it started (e.g. the node name was refused): nothing is written

            def on_results(results: list[RuleResult], final: bool) -> None:
                if not final:
                    self._ask_stacks(run, results)  # first: a hung job's stacks before any action ends it
                _write(run, results)
                self._act(run, results, live=not final)
                if not final:
                    self._escalate(run, results)

            self._results = follow(run, self.rules, self.params, every_s=self.interval_s, finished=self._stop.is_set,
                                   on_results=on_results, sleep=self._sleep)
        except Exception as exc:  # the job goes on; the rules are evaluated in one batch at the end
            warn_once("live-rules", "live rule evaluation stopped (%s: %s); the rules run when the job ends",
                      type(exc).__name__, exc)
            self._results = None

    def _rules(self) -> list:
        """The built-ins and the custom rules that load; one that cannot be loaded is said (once) and left out,
        never taking the built-ins with it."""
        from stallwatch.analyze.rules.base import ParameterError
        from stallwatch.analyze.rules.registry import builtin_rules, load_custom

        custom = []
        for spec in self.config.custom_rules:
            try:
                custom += load_custom([spec])
            except ParameterError as exc:
                warn_once(f"custom-rule-{spec}", "%s; the other rules are evaluated without it", exc)
        return builtin_rules() + [c for c in custom if c.name not in {b.name for b in builtin_rules()}]

    def _params(self) -> dict[str, dict[str, str]]:
        """The configuration's rule parameters (`--param`); wrong ones are said once and left out (the launcher
        refuses them from the command line before the job starts: these came from a config file)."""
        from stallwatch.analyze.rules.base import ParameterError
        from stallwatch.analyze.rules.registry import parse_params

        try:
            return parse_params(self.config.rule_params, self.rules)
        except ParameterError as exc:
            warn_once("rule-params", "%s; the rules are evaluated with their defaults", exc)
            return {}

    def _act(self, run: Any, results: list[RuleResult], live: bool = False) -> None:
        from stallwatch.analyze.judge.actions import RuleActions

        try:
            if self.actions is None:
                self.actions = RuleActions(self.config, run.location)
            self.actions.live = live
            self.actions.on_results(results)
        except Exception as exc:
            warn_once("rule-actions", "rule actions failed (%s: %s)", type(exc).__name__, exc)


    def _sleep(self, seconds: float) -> None:
        """Until the next evaluation, or the job's end; sooner right after stacks were asked for, so that the
        finding names the rank behind (and the actions run) as soon as they are in, not an interval later."""
        asked, self._asked_stacks = self._asked_stacks, False
        self._stop.wait(min(seconds, STACKS_SOON_S) if asked else seconds)

    def _ask_stacks(self, run: Any, results: list[RuleResult]) -> None:
        """A rank that stopped: every process of the job is asked for its Python stacks (once per stop)."""
        from stallwatch.analyze.rules.stack_requests import StackRequests

        try:
            if self.stacks is None:
                self.stacks = StackRequests(run.location)
            before = self.stacks.requests
            self.stacks.on_results(results)
            self._asked_stacks = self.stacks.requests > before
        except Exception as exc:
            warn_once("stack-requests", "could not ask the job for its stacks (%s: %s)", type(exc).__name__, exc)

    def _escalate(self, run: Any, results: list[RuleResult]) -> None:
        """A firing rule asks for a short detailed capture of what follows (within its budget)."""
        from stallwatch.analyze.judge.escalation import Escalation

        try:
            if self.escalation is None:
                self.escalation = Escalation(self.config, run.location, self._created_us)
            self.escalation.on_results(results)
        except Exception as exc:
            warn_once("escalation", "automatic captures failed (%s: %s)", type(exc).__name__, exc)


def _write(run: Any, results: list[RuleResult]) -> None:
    from stallwatch.analyze.judge.runner import write_results

    try:
        write_results(run.location, results)
    except OSError as exc:
        warn_once("rules-write", "cannot write the rule results into %s (%s)", run.uri, exc)
