"""The planner's perf room."""
