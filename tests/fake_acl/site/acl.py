"""`import acl` for a ge-serve process under test: the strict fake, set up from the env.

Put this folder on PYTHONPATH (with tests/ itself) to make the server see an "NPU":
FAKE_ACL_DEVICES (default 1), FAKE_ACL_SOC (default Ascend310P3), FAKE_ACL_MEMORY (bytes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fake_acl.core import FakeAcl, install

install(
    FakeAcl(
        devices=int(os.environ.get("FAKE_ACL_DEVICES", "1")),
        soc=os.environ.get("FAKE_ACL_SOC", "Ascend310P3"),
        memory=int(os.environ.get("FAKE_ACL_MEMORY", str(8 * 1024**3))),
    ),
    sys.modules[__name__],
)
