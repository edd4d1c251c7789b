"""How many tasks a stage runs (:func:`task_count`)."""

from __future__ import annotations


def task_count(cores: int, wanted: int) -> int:
    """Tasks for a stage that wants ``wanted`` of them: at least two per
    core, and a whole number of waves (a multiple of the cores), so that no
    core waits alone for a last task."""
    cores = max(1, cores)
    return -(-max(wanted, 2 * cores) // cores) * cores
