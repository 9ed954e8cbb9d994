"""The planner's search room."""
