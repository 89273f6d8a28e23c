"""Where the tests find the repository's example data and the
`blis-replay` binary they compare the package with."""

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def replay_bin() -> str:
    """The command line the package must agree with: BLIS_REPLAY_BIN, else
    the workspace's release or debug build."""
    given = os.environ.get("BLIS_REPLAY_BIN")
    candidates = [given] if given else []
    candidates += [str(ROOT / "target" / p / "blis-replay") for p in ("release", "debug")]
    for c in candidates:
        if c and Path(c).is_file():
            return c
    found = shutil.which("blis-replay")
    if found:
        return found
    pytest.fail(
        "blis-replay is not built: run `cargo build --release -p blis-replay` "
        "or set BLIS_REPLAY_BIN"
    )
