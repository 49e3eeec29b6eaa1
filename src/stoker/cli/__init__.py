"""The ``stoker`` command line: a thin layer over the public functions."""
