"""The ``dayzero`` command line: one verb per step of Day-0 adaptation (see ``app.py``)."""
