import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config):
    # The CLI binary the tests compare against: NEARDUP_BIN, else cargo's build.
    if not os.environ.get("NEARDUP_BIN"):
        for p in [ROOT / "target/release/neardup", ROOT / "target/debug/neardup"]:
            if p.exists():
                os.environ["NEARDUP_BIN"] = str(p)
                break
