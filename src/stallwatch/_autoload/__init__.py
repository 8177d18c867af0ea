"""Start-up code that `stallwatch run` puts on the job's PYTHONPATH (see sitecustomize.py)."""
