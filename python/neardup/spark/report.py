"""The run's figures: the progress lines (:func:`_log`), each stage's
seconds, rows and bytes shuffled (:class:`_Report`, from the driver's
status store), and ``--report``'s JSON (:func:`_write_report`).

Reads Spark's status store on the driver; runs no Spark job of its own.
"""

from __future__ import annotations

import json
import sys
from typing import Any




class _Report:
    """Per-stage figures of a run: seconds, rows, the bytes the stage wrote
    to Spark's shuffle and its longest task (from the driver's status store:
    every stage Spark ran since the last one recorded), for the log and
    ``--report``."""

    def __init__(self, spark: Any):
        self.spark = spark
        self.stages: list = []
        self.documents = 0
        self._last = self._shuffle()[0]

    def _shuffle(self) -> tuple:
        """(the newest Spark stage id, bytes written by stages after
        ``_last``, their longest task: a dict of its seconds, the median
        task's seconds of its Spark stage and that stage's task count)."""
        try:
            jvm, sc = self.spark._jvm, self.spark.sparkContext
            store = sc._jsc.sc().statusStore()
            empty = jvm.java.util.ArrayList()
            it = store.stageList(empty, False, False, sc._gateway.new_array(jvm.double, 0), empty).iterator()
            quantiles = sc._gateway.new_array(jvm.double, 2)
            quantiles[0], quantiles[1] = 0.5, 1.0
            newest, written, longest = -1, 0, None
            last = getattr(self, "_last", -1)
            while it.hasNext():
                st = it.next()
                newest = max(newest, st.stageId())
                if st.stageId() <= last:
                    continue
                written += st.shuffleWriteBytes()
                summary = store.taskSummary(st.stageId(), st.attemptId(), quantiles)
                if summary.isDefined():
                    d = summary.get().duration()
                    median, most = d.apply(0) / 1000, d.apply(1) / 1000
                    if longest is None or most > longest["longest_task_seconds"]:
                        longest = {"longest_task_seconds": round(most, 3), "median_task_seconds": round(median, 3),
                                   "tasks": st.numTasks()}
            return newest, written, longest
        except Exception:  # noqa: BLE001 - Spark Connect, or another status store
            return -1, None, None

    def done(self, name: str, seconds: float, documents: int, **rows: int) -> None:
        newest, written, longest = self._shuffle()
        self._last = max(self._last, newest)
        self.stages.append({
            "stage": name,
            "seconds": round(seconds, 3),
            "shuffle_bytes": written,
            "shuffle_bytes_per_document": round(written / documents, 1) if written is not None and documents else None,
            "longest_task": longest,
            **rows,
        })

    def driver_memory(self) -> dict:
        """Peak resident memory of the driver's Python process and, when it
        runs on this machine, of its JVM."""
        import resource

        out = {"python_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "jvm_peak_bytes": None}
        try:
            pid = self.spark._jvm.java.lang.ProcessHandle.current().pid()
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out["jvm_peak_bytes"] = int(line.split()[1]) * 1024
        except Exception:  # noqa: BLE001 - another machine or no /proc
            pass
        return out


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"neardup.spark: {message}", file=sys.stderr, flush=True)


def _write_report(path: str, result: Any, seconds: float) -> None:
    """The run's ``--report``: per stage its seconds, rows and bytes
    shuffled, and the driver's peak memory, as JSON."""
    report = result.report or _Report(None)
    report.done("write", result.stages.get("write", 0.0), report.documents)
    out = {"documents": report.documents, "seconds": round(seconds, 3), "stages": report.stages, "driver": report.driver_memory()}
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


def _log_shuffles(report: _Report, quiet: bool) -> None:
    """One line per stage that shuffled: its bytes, per document too, and
    its longest task."""
    for st in report.stages:
        if st["shuffle_bytes"] is not None:
            task = st["longest_task"]
            tail = (f", longest task {task['longest_task_seconds']:.1f} s (its Spark stage's median "
                    f"{task['median_task_seconds']:.1f} s of {task['tasks']:,} tasks)") if task else ""
            _log(quiet, f"{st['stage']}: {st['shuffle_bytes'] / 1e6:,.1f} MB shuffled "
                 f"({st['shuffle_bytes_per_document']:,.0f} bytes a document){tail}")
