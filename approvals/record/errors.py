"""Record's errors: an unreadable anchor, a refused export or import and the
problems it lists. Imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass


class AnchorUnreadable(ValueError):
    """An anchor file that is not one (or holds no anchor); the message says why."""


class ExportRefused(Exception):
    """A run that cannot be exported as it stands (say why)."""


@dataclass(frozen=True)
class Problem:
    """What is wrong with an import file, and where (its 1-based line number)."""

    line: int | None
    problem: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}" if self.line else self.problem


class ImportRefused(Exception):
    """Nothing was written; ``problems`` says why, first problem first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems[:5]))
