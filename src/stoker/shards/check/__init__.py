"""Checking shard sets: verify every byte, score the mixing of labels, summarize what a set holds."""

__all__: list[str] = []  # a namespace of modules: import from them
