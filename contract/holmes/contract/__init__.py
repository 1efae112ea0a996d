"""What the operator, the planner and the trainer share, and nothing else: the HolmesJob spec
(:func:`load_job`), the Layout the planner hands the trainer, parameter and FLOP counts,
the API's names and label keys, and the names of the trainer's metrics (trainer_metrics).
Every module here is read by both sides (tests/unit/repo/test_contract_is_shared.py): what one side alone
reads lives on that side. Imports only the standard library and PyYAML; nothing in Holmes
imports the other way (tests/unit/repo/test_import_directions.py)."""

from .flops import ModelCost
from .jobspec import JobSpec, SpecError, load_job
from .layout import Layout, LayoutError
from .spec_sections import ModelSpec

__all__ = ["JobSpec", "Layout", "LayoutError", "ModelCost", "ModelSpec", "SpecError", "load_job"]
