"""The training engine: ``fit``, its epochs, the run's state, checkpoints, resume, timing and adaptation."""

__all__: list[str] = []  # a namespace of modules: import from them
