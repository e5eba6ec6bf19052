"""Timing: per-call times of the candidate and the baselines, and the cache of baseline times."""
