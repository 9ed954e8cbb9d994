"""Shared test helpers, importable as ``helpers.<module>`` from every test directory (pyproject's
``[tool.pytest.ini_options] pythonpath`` puts ``tests/`` on sys.path); the worker scripts here are run
by path by the tests that spawn ranks, and are not collected."""
