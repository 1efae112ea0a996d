"""Why the planner returns no layout (the message says what is missing and what would fix it)."""

from __future__ import annotations


class PlanError(ValueError):
    """No valid layout; the message says what is missing and what would fix it."""


class InsufficientNodes(PlanError):
    """Not enough suitable nodes (yet): the operator waits for nodes instead of stalling."""


class PlanTooLarge(PlanError):
    """The search would cost more than its budget (``budget.py``): the spec must say more
    (fixed degrees) or ask for less (fewer nodes or layers). Never retried at a smaller size of
    the same spec: the operator stalls the job until the spec changes."""
