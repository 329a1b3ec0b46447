"""Playbooks: procedural cells that count how often they worked.

`POST /memories/{id}/outcome` adds one to `scoring.success_count` or `scoring.failure_count`.
Search with `rank_playbooks: true` re-scores procedural hits with the Wilson score lower
bound of their success rate (95%, z = 1.96):

    wilson = (p + z²/2n - z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n),  p = successes / n

    score = (score + wilson) / 2          for procedural hits; other hits keep their score

An untried playbook has wilson 0, one success 0.21, 9 of 10 0.60, 95 of 100 0.89: evidence,
not a single lucky run, moves a playbook up. Consolidation shows the counts to the model
when it refines or replaces a playbook.
"""

from __future__ import annotations

import math

from .models import MemoryCell, MemoryType

Z95 = 1.96


def wilson_lower_bound(successes: int, failures: int, z: float = Z95) -> float:
    n = successes + failures
    if n == 0:
        return 0.0
    p = successes / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / (1 + z * z / n))


def outcome_counts(cell: MemoryCell) -> tuple[int, int]:
    return cell.scoring.success_count or 0, cell.scoring.failure_count or 0


def playbook_score(cell: MemoryCell, score: float) -> tuple[float, float]:
    """(new score, wilson) for a search hit; non-procedural cells keep their score."""
    if cell.type != MemoryType.procedural.value:
        return score, 0.0
    wilson = wilson_lower_bound(*outcome_counts(cell))
    return (score + wilson) / 2, wilson


__all__ = ["outcome_counts", "playbook_score", "wilson_lower_bound"]
