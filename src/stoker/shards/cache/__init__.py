"""The verified local cache of remote shards and the manifests of remote sets."""
