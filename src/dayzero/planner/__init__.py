"""Planner: memory, communication, performance and search (pure functions over specs; numpy; no torch)."""
