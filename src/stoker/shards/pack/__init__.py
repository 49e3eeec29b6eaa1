"""Packing: write a data set's samples, shuffled, into checksummed shards, locally, to a bucket, or on Ray."""

__all__: list[str] = []  # a namespace of modules: import from them
