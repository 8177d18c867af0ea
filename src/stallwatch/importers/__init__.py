"""Importers: turn another profiler's output into a stallwatch run, written only through `stallwatch.store`."""
