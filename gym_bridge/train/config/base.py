"""The base of every config section and the error every config problem raises."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

__all__ = ["DOTTED_PATH", "ConfigError", "Section"]

DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
"""An importable dotted path (``torch.optim.AdamW``)."""


class ConfigError(ValueError):
    """A configuration that cannot run; ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid config:\n  " + "\n  ".join(problems))


class Section(BaseModel):
    """Base for every section: unknown keys are errors, attribute docstrings are field docs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
