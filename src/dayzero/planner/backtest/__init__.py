"""The planner's backtest room."""
