"""Packing: write a data set's samples, shuffled, into checksummed shards, locally, to a bucket, or on Ray."""
