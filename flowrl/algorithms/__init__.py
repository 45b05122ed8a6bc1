"""Algorithms as plans: one file each, with a frozen config, a policy and ``plan(workers, config)``."""
