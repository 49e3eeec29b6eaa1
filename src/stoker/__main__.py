"""``python -m stoker ...``: the ``stoker`` command, also what ``torchrun ... -m stoker train ...`` starts."""

from __future__ import annotations

from stoker.cli.main import main

if __name__ == "__main__":
    main()
