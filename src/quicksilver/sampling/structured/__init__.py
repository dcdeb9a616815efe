"""Structured output, compiled for a diffusion canvas: a JSON schema (or a tool call) becomes a
skeleton of prefilled tokens plus value slots whose commits are grammar-checked.

The compiler, bottom up: ``grammar.py`` (byte-level NFA combinators and their token view per slot),
``pattern.py`` (the JSON-schema ``pattern`` subset compiled into those machines),
``constrained.py`` (schema -> skeleton pieces and slots, with budgets), ``layout_cache.py`` (a
byte-bounded LRU of compiled layouts) and ``canvas.py`` (a layout laid out on the canvas: the
``Constraint`` the decoders ask at every commit, plus the token-set constraints). It knows nothing of
the decoders: they see only the ``Constraint`` protocol of ``sampling/core/hooks.py``.
"""
