"""dayzero: Day-0 adaptation of giant open LLMs to an accelerator cluster.

The Python API mirrors the CLI verbs; import from the layer you need:

    from dayzero.specs import load_model, get_cluster, ParallelConfig
    from dayzero.specs.counting import summarize          # dayzero inspect
"""

__version__ = "0.1.0"
