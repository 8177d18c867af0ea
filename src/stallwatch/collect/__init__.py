"""Collect: everything that observes the machine or the training job and produces records."""
