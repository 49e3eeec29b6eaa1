"""Reading shards: a memory-mapped shard file, a split of a set, the map-style ShardDataset and the ShardStream."""

__all__: list[str] = []  # a namespace of modules: import from them
