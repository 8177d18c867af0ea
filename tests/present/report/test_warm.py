"""The report's imports warmed while the job runs: in a thread that only uses an otherwise idle core, done
before the report is built, and harmless when it cannot be (the report imports then, as before)."""

from __future__ import annotations

import subprocess
import sys

CHECK = '''
import os, sys, threading
from stallwatch.present.report import warm
policies = []
real = os.sched_setscheduler
def spy(tid, policy, param):
    policies.append((tid == threading.get_native_id(), threading.current_thread().name, policy))
    return real(tid, policy, param)
os.sched_setscheduler = spy
done = warm.warm_in_background(start_after_s=0.0)
assert done.wait(60), "the warm-up did not finish"
print(sorted(m for m in ("bokeh", "stallwatch.present.drawpage", "stallwatch.present.report") if m in sys.modules))
print(policies == [(True, "stallwatch-report-warm-up", os.SCHED_IDLE)], policies)
'''


def test_the_report_code_is_imported_in_an_idle_priority_thread():
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    modules, policy = p.stdout.splitlines()
    assert modules == "['stallwatch.present.drawpage', 'stallwatch.present.report']"  # bokeh's Python: never
    assert policy.startswith("True"), policy


def test_a_failed_import_ends_the_warm_up_quietly():
    code = ("import sys; sys.modules['stallwatch.present.drawpage'] = None\n"  # an import that fails
            "from stallwatch.present.report import warm\n"
            "print(warm.warm_in_background(start_after_s=0.0).wait(60))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "True" and p.stderr == "", p.stderr
