"""The ``stepstream`` command of the Python package: the hub, ``tail``, ``import``,
``token``, ``watch``... are one Rust binary, shipped inside the wheel (``scripts/dist``)
and run in place of this process, so signals and the exit status are the binary's own.

A wheel built without it (``pip install ./python`` from a checkout) says so and where to
get it; ``STEPSTREAM_BIN`` names another binary.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

BUNDLED = Path(__file__).parent / "_bin" / "stepstream"


def binary() -> str:
    """The stepstream binary this package runs: ``STEPSTREAM_BIN``, else the bundled one."""
    chosen = os.environ.get("STEPSTREAM_BIN")
    if chosen:
        return chosen
    if not BUNDLED.is_file():
        sys.exit(
            "stepstream: this install of the Python package has no hub binary (a wheel "
            "built from a checkout with `pip install ./python` holds the collector only). "
            "Install the wheel that `scripts/dist` builds, or `cargo install --path .` in "
            "the checkout, or set STEPSTREAM_BIN to a stepstream binary."
        )
    mode = BUNDLED.stat().st_mode
    if not mode & stat.S_IXUSR:
        # Some installers drop the executable bit of a wheel's data files.
        try:
            BUNDLED.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as e:
            sys.exit(f"stepstream: the bundled binary {BUNDLED} is not executable: {e}")
    return str(BUNDLED)


def main() -> None:
    path = binary()
    try:
        os.execv(path, [path, *sys.argv[1:]])
    except OSError as e:
        sys.exit(f"stepstream: cannot run {path}: {e}")


if __name__ == "__main__":
    main()
