"""The backtest room: published training runs read as planner inputs, predicted and scored.

Reading order: ``csv_values`` (numbers as the columns write them), ``model_names`` (model names ->
dayzero architectures, with ``data/published_models.json``), ``row_arch`` (a row's architecture),
``interconnect_text`` (a row's interconnect statement -> the two tiers' bandwidth),
``run_features`` (training features stated in words -> options), ``row_text`` (device counts,
tokens per batch, MFU and packed documents stated in the notes), ``row_metric`` (any published
metric -> tokens/s per device under its FLOP definition), ``row_memory`` (what a run kept in
memory, and the settings a row leaves blank chosen so it fits), ``published`` (rows -> cases:
spec, cluster, layout, options, measured tokens/s), ``backtest`` (:func:`run_backtest`, the
error per row and group, and the fit of the efficiency constants) and ``own_runs`` (a team's runs
refit the constants, with their leave-one-out error: ``dayzero calibrate --runs``).
"""

from dayzero.planner.exports import lazy_exports

EXPORTS = {
    "GROUP_BY": "backtest", "fit_constants": "backtest", "leave_one_group_out": "backtest",
    "run_backtest": "backtest",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
