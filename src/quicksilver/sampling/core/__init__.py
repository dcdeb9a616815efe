"""The shared primitives every decoder is built from: ``SamplerConfig`` (``config.py``), the unmasking
policies (``policies.py``), token sampling from seeded generators (``noise.py``), batched selection
on the device (``select.py``), a step's hooks — revision, editing, stops, the ``Constraint``
protocol (``hooks.py``), the per-request state and events (``state.py``) and the cache modes
(``caches.py``). Nothing here knows which decoder runs it.
"""
