"""Config-driven runs (``stoker train``): the TOML keys, data and models by name, the test split, run comparison."""

__all__: list[str] = []  # a namespace of modules: import from them
