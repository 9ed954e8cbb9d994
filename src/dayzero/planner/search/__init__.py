"""The search room: the fastest layouts that fit, over the whole parallel space at once.

Reading order: ``search_space`` (what the search enumerates, dim by dim), ``switches`` (the
memory switches tried per layout), ``cp_choice`` (which context-parallel exchange a layout gets),
``search_fit`` (which variants of each base layout fit, and the fewest that need trying; its climb
of the recompute levels for one group of bases is ``level_climb``),
``explain`` (a plan's family and its binding constraint), ``error_band`` (how far the backtest says a
plan of this kind has been from measurement), ``search`` (:func:`plan`: enumerate, prune by
memory, rank by step time), ``sensitivity`` (how the best plan moves when uncertain inputs move),
``remedies`` (every single-flag change that makes a layout fit) and ``scenario``
(:func:`plan_scenario`: ``dayzero plan``'s flags as one search, with each plan's training cost).
Memory and step time come from :mod:`dayzero.planner.memory` and :mod:`dayzero.planner.perf`.
"""

from dayzero.planner.exports import lazy_exports

EXPORTS = {"SearchSpace": "search", "plan": "search", "single_changes": "remedies", "ErrorBand": "error_band",
           "load_table": "error_band", "plan_scenario": "scenario"}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
