"""`stallwatch run` with rules: the stop_training action stops a real training run early, gracefully, with
its reason recorded; a custom rule named on the command line runs like a built-in."""

from __future__ import annotations

import json
import sys

from stallwatch.store.reader import open_run
from tests.collect._support import stallwatch as run_cli

JOB = '''
import time, torch

class Slow(torch.utils.data.Dataset):  # each sample costs 1 ms, loaded in the main process: the loop starves
    def __len__(self): return 4000
    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.randn(8)

m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Slow(), batch_size=4)
done = 0
for epoch in range(3):
    for xb in loader:
        opt.zero_grad(); m(xb).sum().backward(); opt.step(); done += 1
print("finished normally after", done, "steps", flush=True)
'''


def test_the_stop_training_action_stops_a_real_run_early_with_its_reason(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run = tmp_path / "run"
    # the job's events reach the store every second (not every 5 s): the live rules see the starving loop sooner
    p = run_cli(tmp_path, "run", "--report", "off", "--flush-interval", "1",
                "--out", str(run), "--rules-interval", "1", "--rule-action", "Dataloader=stop_training",
                "--", sys.executable, str(script), timeout=240)
    assert p.returncode == 0, p.stderr  # stopped gracefully: the script ran to its end
    done = int(p.stdout.decode().split("after")[1].split()[0])
    assert 0 < done < 3000  # 3 epochs of 1000 steps were planned
    reason = json.loads((run / "config.json").read_text())["stop_training"]
    assert reason.startswith("rule Dataloader triggered")
    (stop,) = open_run(str(run)).framework(kinds=["stop"]).to_pylist()
    assert json.loads(stop["args"])["reason"] == reason and json.loads(stop["args"])["train_steps"] == done
    assert "stopping training at the next step boundary" in p.stderr


def test_a_custom_rule_from_a_file_runs_like_a_builtin(tmp_path):
    rule = tmp_path / "my_rules.py"
    rule.write_text(
        "from stallwatch.analyze.rules import Rule\n"
        "class TrainSteps(Rule):\n"
        "    name = 'TrainSteps'\n"
        "    description = 'Counts training steps.'\n"
        "    recommendation = 'None needed.'\n"
        "    defaults = {'at_least': 1}\n"
        "    def __init__(self, **p):\n"
        "        super().__init__(**p)\n"
        "        self.steps = 0\n"
        "    def update(self, chunk):\n"
        "        ev = chunk.framework\n"
        "        self.steps += sum(1 for k, m in zip(ev['kind'].to_pylist(), ev['mode'].to_pylist())\n"
        "                          if k == 'step' and m == 'TRAIN')\n"
        "    def result(self):\n"
        "        hit = int(self.steps >= self.params['at_least'])\n"
        "        return self.make_result(triggered=hit, violations=0, datapoints=self.steps, details={})\n")
    script = tmp_path / "job.py"
    script.write_text(JOB.replace("range(3)", "range(1)").replace("4000", "80"))
    run = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(run), "--custom-rule", f"{rule}:TrainSteps", "--",
                sys.executable, str(script), timeout=120)
    assert p.returncode == 0, p.stderr
    result = json.loads((run / "rules" / "TrainSteps.json").read_text())
    assert result["Datapoints"] == 20 and result["RuleTriggered"] == 1 and "TrainSteps" in p.stderr
    # The run's config names the rule, but a run directory never makes stallwatch load code: `stallwatch rules`
    # says so and how to run it; named on the command line by the person analysing the run, it runs.
    p = run_cli(tmp_path, "rules", str(run), "--rule", "TrainSteps")
    assert p.returncode == 2 and "recorded with custom rule(s)" in p.stderr and "--custom-rule" in p.stderr
    assert "no rule named 'TrainSteps'" in p.stderr
    p = run_cli(tmp_path, "rules", str(run), "--custom-rule", f"{rule}:TrainSteps", "--rule", "TrainSteps",
                "--param", "TrainSteps.at_least=50")
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "rules" / "TrainSteps.json").read_text())["RuleTriggered"] == 0
