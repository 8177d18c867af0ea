"""Feeding and running rules: the batch feed, the live feed, per-node feeds on an engine's workers, the runner that
writes rules/*.json, and what runs them during a job (actions, escalation)."""
