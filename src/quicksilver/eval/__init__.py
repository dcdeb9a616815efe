"""The ``eval`` command: the task suite's scores (``suite.evaluate``) as tables, sweeps and plots,
GSM8K from a local file, and the served tool-call check."""
