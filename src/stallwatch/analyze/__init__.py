"""Analyze: pure computations over the frames the store hands out (rules, statistics, summaries)."""
