"""Operator mapping: trace a model's real modeling code, map every ATen operator to a backend's
operator library, find decompositions for the missing ones and fusion opportunities.

Imports torch (and transformers when tracing); the planner never imports this package."""
