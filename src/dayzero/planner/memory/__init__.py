"""The planner's memory room."""
