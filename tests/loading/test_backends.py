"""One list of loader backends, readable without torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_loader_takes_the_one_backend_list() -> None:
    from stoker.loading import loader
    from stoker.loading.backends import BACKENDS
    from stoker.train.runner.config import BACKENDS as CONFIG_BACKENDS

    assert tuple(loader.BACKENDS) == BACKENDS == ("process", "thread")
    assert CONFIG_BACKENDS == ("auto", *BACKENDS)


def test_the_backend_list_and_the_method_names_import_no_torch() -> None:
    code = (
        "import sys; import stoker.loading.backends, stoker.bench.methods, stoker.bench.plan; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
