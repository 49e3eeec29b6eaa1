"""Reading shards: a memory-mapped shard file, a split of a set, the map-style ShardDataset and the ShardStream."""
