"""One benchmark problem (:class:`Example`), the error of a dataset that cannot be
loaded, and a fingerprint of a selection of problems: what every loader returns.

Example:
    >>> ex = Example(id="q1", prompt="2+2?", gold="4")
    >>> len(dataset_fingerprint([ex]))
    16
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import Task

__all__ = ["DatasetError", "Example", "Split", "dataset_fingerprint"]

Split = Literal["train", "test"]


class DatasetError(InvalidRequestError):
    """A dataset that cannot be found, read or mapped (the message says what to do)."""


class Example(BaseModel):
    """One benchmark problem.

    ``verifier`` names the :mod:`verifiers` check that scores it (``math``,
    ``code``, ``exact``, ...). ``metadata`` is label-free and goes to the Task;
    ``private`` (reference solutions, hidden tests) never does.

    Example:
        >>> ex = Example(id="q1", prompt="2+2?", gold="4", verifier="math", level=1)
        >>> ex.to_task().question, "4" in ex.to_task().model_dump_json()
        ('2+2?', False)
    """

    id: str
    prompt: str
    gold: str | None = None
    verifier: str = "math"
    dataset: str = ""
    level: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    private: dict[str, Any] = Field(default_factory=dict)

    def to_task(self) -> Task:
        """The engine Task a strategy solves: prompt and public metadata, no gold."""
        md = dict(self.metadata)
        if self.level is not None:
            md.setdefault("level", self.level)
        return Task.from_prompt(self.prompt, id=self.id, metadata=md)

    def verify_task(self) -> Task:
        """The Task handed to the verifier: public plus private metadata (hidden tests)."""
        task = self.to_task()
        return task.model_copy(update={"metadata": {**task.metadata, **self.private}})


def dataset_fingerprint(examples: Sequence[Example]) -> str:
    """A short hash of the selected problems (ids, prompts, golds), to detect a changed file."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.id, ex.prompt, ex.gold], ensure_ascii=False).encode())
    return h.hexdigest()[:16]

