"""The shard format: the Arrow schema of a shard, its golden constants, and ``manifest.json``."""

__all__: list[str] = []  # a namespace of modules: import from them
