"""Rule actions: each runs once when its rule first fires — a log line, a command, a POST of the result
to a real HTTP server on loopback, and stop_training through the run's live configuration."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from stallwatch.analyze.judge.actions import RuleActions
from stallwatch.analyze.rules.base import RuleResult
from stallwatch.config import ProfilerConfig
from stallwatch.store.location import RunLocation


def _result(name: str, triggered: int) -> RuleResult:
    return RuleResult(name, triggered, triggered, 10, {"threshold": 3}, "d", "Add workers. Then look again.", {})


def _run_dir(tmp_path, config: ProfilerConfig) -> RunLocation:
    location = RunLocation(str(tmp_path))
    location.write_atomic("config.json", config.to_json().encode())
    return location


def test_actions_run_once_when_a_rule_first_fires(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="stallwatch")
    logging.getLogger("stallwatch").propagate = True
    out = tmp_path / "out.txt"
    config = ProfilerConfig(rule_actions=(f"StepOutlier=command:echo $STALLWATCH_RULE $STALLWATCH_RULE_TRIGGERED >> {out}",
                                          "Dataloader=log"))
    actions = RuleActions(config, _run_dir(tmp_path, config))
    actions.on_results([_result("StepOutlier", 0), _result("Dataloader", 0)])
    actions.on_results([_result("StepOutlier", 2), _result("Dataloader", 1)])
    actions.on_results([_result("StepOutlier", 5), _result("Dataloader", 3)])  # already fired: nothing again
    deadline = time.monotonic() + 10
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert out.read_text() == "StepOutlier 2\n"
    said = [r.getMessage() for r in caplog.records if "triggered" in r.getMessage()]
    assert len(said) == 2 and "Add workers." in said[0]


def test_notify_posts_the_result_json(tmp_path):
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = ProfilerConfig(rule_actions=(f"CPUBottleneck=notify:http://127.0.0.1:{server.server_port}/hook",))
        actions = RuleActions(config, _run_dir(tmp_path, config))
        actions.on_results([_result("CPUBottleneck", 4)])
        actions.wait()
    finally:
        server.shutdown()
    assert got and got[0]["RuleName"] == "CPUBottleneck" and got[0]["RuleTriggered"] == 4


def test_a_notify_url_that_does_not_answer_never_blocks(tmp_path):
    config = ProfilerConfig(rule_actions=("CPUBottleneck=notify:http://127.0.0.1:9/nothing",))
    actions = RuleActions(config, _run_dir(tmp_path, config))
    t = time.monotonic()
    actions.on_results([_result("CPUBottleneck", 1)])
    assert time.monotonic() - t < 1  # a hang guard: the POST runs in the background
    actions.wait(15)


def test_stop_training_is_written_into_the_live_config_once(tmp_path):
    config = ProfilerConfig(rule_actions=("StepOutlier=stop_training", "Dataloader=stop_training"))
    location = _run_dir(tmp_path, config)
    actions = RuleActions(config, location)
    actions.on_results([_result("StepOutlier", 1)])
    actions.on_results([_result("Dataloader", 1)])  # the first reason stays
    written = ProfilerConfig.from_dict(json.loads(location.read("config.json")))
    assert written.stop_training == "rule StepOutlier triggered: Add workers."
    assert written.rule_actions == config.rule_actions


def test_a_live_hangs_actions_wait_for_the_stacks_it_asked_for(tmp_path):
    """Hang's actions (which may end the job) run once the stopped ranks' stacks are in the run, not before; at
    the end of the run, or once the stacks are in, at once."""
    from stallwatch.analyze.rules.hang import HangDetails

    out = tmp_path / "out.txt"
    config = ProfilerConfig(rule_actions=(f"Hang=command:echo $STALLWATCH_RULE >> {out}",))

    def hang(wanted: list[str]) -> RuleResult:
        details = HangDetails(factor=10, floor_s=40, now_us=None, ranks={}, stopped=list(wanted), behind=[],
                              behind_reason="", waiting_in="", stalls=[], stalls_total=0, stacks_wanted=wanted,
                              time_at_stake_s=0.0, title=None)
        return RuleResult("Hang", 2, 2, 2, {"factor": 10, "floor_s": 40}, "d", "A rank stopped.", details.to_json())

    actions = RuleActions(config, _run_dir(tmp_path, config))
    actions.live = True
    actions.on_results([hang(["vm/0", "vm/1"])])
    assert actions.done == []  # stacks asked for, not in yet
    actions.on_results([hang([])])
    assert actions.done == [("Hang", f"command:echo $STALLWATCH_RULE >> {out}")]
    ended = RuleActions(config, _run_dir(tmp_path / "ended", config))  # the end-of-run evaluation: no waiting
    ended.on_results([hang(["vm/0"])])
    assert len(ended.done) == 1
