"""The shard format: the Arrow schema of a shard, its golden constants, and ``manifest.json``."""
