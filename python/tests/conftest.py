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
    # The Spark tests' corpora are a few thousand documents: four shuffle
    # partitions (not the job's 4 x cores) keep several tasks a stage, at
    # less scheduling on the test machine's two cores. A session's own
    # setting wins, as the job's does.
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.sql.shuffle.partitions=4 pyspark-shell")


def pytest_collection_modifyitems(session, config, items):
    # The longest tests first (the standalone cluster's, then the other Spark
    # jobs), the quick ones after: when the tests run in several processes,
    # the quick ones fill the gaps and no long test starts last.
    def cost(item):
        if "standalone" in item.name:
            return 0
        if item.path.name == "test_spark.py" or "spark" in item.name:
            return 1
        return 2

    items.sort(key=cost)
