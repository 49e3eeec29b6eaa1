"""The verified local cache of remote shards and the manifests of remote sets."""

__all__: list[str] = []  # a namespace of modules: import from them
