"""The paper's operators: rollout, train, replay, concurrency and metrics (SEMANTICS.md §3)."""
