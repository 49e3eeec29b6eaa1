"""The training engine: ``fit``, its epochs, the run's state, checkpoints, resume, timing and adaptation."""
