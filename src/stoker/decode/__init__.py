"""Decoding: bytes of one image file to a uint8 RGB CHW tensor; JPEG batches fast or on the device; what a header declares."""

__all__: list[str] = []  # a namespace of modules: import from them
