"""Operator mapping: trace a model's real modeling code, map every ATen operator to a backend's
operator library, find decompositions for the missing ones and fusion opportunities.

``analyze(model, manifest)`` (see :mod:`dayzero.ops.report`) is the ``dayzero ops`` verb. This
package imports torch (and transformers when tracing); the planner never imports it.
"""

__all__ = ["analyze", "map_trace"]


def __getattr__(name: str):
    if name in __all__:  # lazy: importing dayzero.ops.manifest alone must not pull in transformers
        from dayzero.ops import report

        return getattr(report, name)
    raise AttributeError(name)
