"""The task suite shared by training, evaluation and the benchmarks: the tasks and their verifiers
(``tasks``), how an item becomes model input (``render``), and decoding-based scoring
(``evaluate``)."""
