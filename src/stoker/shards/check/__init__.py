"""Checking shard sets: verify every byte, score the mixing of labels, summarize what a set holds."""
