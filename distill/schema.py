"""Pydantic schemas of the training rows distillation writes, and their JSONL I/O.

Rows follow TRL's conversational dataset formats:

- SFT, ``messages``: ``{"messages": [user, assistant], "metadata": {...}}``;
- SFT, ``prompt``/``completion``: ``{"prompt": [user], "completion": [assistant], ...}``
  (TRL then computes the loss on the completion only);
- preference: ``{"prompt": [user], "chosen": [assistant], "rejected": [assistant], ...}``;
- stepwise supervision (a process reward model's data, TRL's ``PRMTrainer``):
  ``{"prompt": "...", "completions": ["step", ...], "labels": [true, ...], ...}``,
  in TRL's standard (string) form, the only one it takes for this type.

Every row carries its provenance in ``metadata`` (source run, strategy, step,
iteration, verifier, model, problem id, weight). Each file holds one row type
with one fixed set of metadata keys, so ``datasets.load_dataset("json", ...)``
infers one schema and TRL infers the format from the first row.

Rows are validated when written and when read: an assistant turn that still
holds refinement scaffolding (``<evaluation>``, ``<answer>`` tags, chat-template
tokens) or is empty is refused, so a bug in cleaning cannot leak into training.

Example:
    >>> row = validate_sft_row({
    ...     "messages": [{"role": "user", "content": "2+2?"},
    ...                  {"role": "assistant", "content": "2+2=4. \\\\boxed{4}"}],
    ...     "metadata": example_provenance()})
    >>> row.messages[-1].role
    'assistant'
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)

from refinery.engine.errors import InvalidRequestError
from refinery.engine.models import DEFAULT_MODEL

__all__ = [
    "DistillError",
    "ChatMessage",
    "MessagesRow",
    "PairProvenance",
    "PairRow",
    "PromptCompletionRow",
    "Provenance",
    "SFTFormat",
    "StepwiseProvenance",
    "StepwiseRow",
    "example_provenance",
    "read_rows",
    "scaffold_leak",
    "validate_pair_row",
    "validate_sft_row",
    "validate_stepwise_row",
    "write_rows",
]

SFTFormat = Literal["messages", "prompt_completion"]

# Tags of refinement scaffolding that must never reach a training target, and
# chat-template control tokens (a target holding them teaches the model to emit them).
SCAFFOLD_TAGS = ("evaluation", "reflection", "plan", "critique", "feedback", "review",
                 "think", "answer", "sub-questions")
_SCAFFOLD_RE = re.compile(r"</?\s*(?:" + "|".join(map(re.escape, SCAFFOLD_TAGS)) + r")\s*>",
                          re.IGNORECASE)
_CHAT_TOKEN_RE = re.compile(r"<\|[A-Za-z_]{1,40}\|>|<\|im_(?:start|end)\|>")


class DistillError(InvalidRequestError):
    """Bad distillation input: a missing run, an empty or malformed dataset."""


def scaffold_leak(text: str) -> str | None:
    """The first scaffold tag or chat token left in ``text``, or ``None`` when clean."""
    m = _SCAFFOLD_RE.search(text) or _CHAT_TOKEN_RE.search(text)
    return m.group(0) if m else None


class ChatMessage(BaseModel):
    """One turn of a training conversation."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)
    # The turn's thinking, apart from its content: a thinking model's chat template
    # renders it in the model's own tags (``<think>...</think>``), so the tags are
    # never written into a target by hand.
    reasoning: str | None = None

    @model_validator(mode="after")
    def _clean_target(self) -> ChatMessage:
        if not self.content.strip():
            raise ValueError(f"empty {self.role} turn")
        if self.reasoning is not None and self.role != "assistant":
            raise ValueError(f"a {self.role} turn holds no reasoning")
        for text in (self.content, self.reasoning or ""):
            if self.role == "assistant" and (leak := scaffold_leak(text)):
                raise ValueError(f"assistant turn still holds scaffolding {leak!r}")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_reasoning(self, handler: Any) -> dict[str, Any]:
        # Rows without thinking are written as they always were (role, content).
        out = handler(self)
        if out.get("reasoning") is None:
            out.pop("reasoning", None)
        return out


class Provenance(BaseModel):
    """Where a training row came from, and how much it counts.

    ``strategy``/``step``/``iteration``/``event_id`` locate the text in the
    source trace (``iteration`` = refinements above it in the provenance DAG:
    0 for a first draft); ``run_strategy`` is the spec of the whole run;
    ``verifier`` says what judged it right (``math`` against the gold answer,
    ``eval:<name>`` the runner's verdict, ``agreement`` label-free signals,
    ``gold`` a reference solution); ``weight`` is the sampling weight training
    honours (2 for prompts refinement rescued, 0.5 for prompts every first
    draft already solved, else 1).
    """

    model_config = ConfigDict(extra="forbid")

    source_run: str
    problem_id: str
    dataset: str | None = None
    level: int | None = None
    run_strategy: str = ""
    strategy: str = ""
    step: str
    iteration: int = Field(0, ge=0)
    event_id: str | None = None
    verifier: str
    model: str = ""
    weight: float = Field(gt=0.0, le=10.0)
    rescued: bool = False
    easy: bool = False
    answer: str | None = None


class PairProvenance(Provenance):
    """Provenance of a preference pair: the chosen side's fields plus the rejected side's.

    ``pair_source`` is ``refinement_edge`` (rejected = a wrong draft, chosen = a
    verified refinement descending from it) or ``correct_incorrect`` (two
    samples of one prompt).
    """

    pair_source: Literal["refinement_edge", "correct_incorrect"]
    rejected_strategy: str = ""
    rejected_step: str
    rejected_iteration: int = Field(0, ge=0)
    rejected_event_id: str | None = None
    rejected_answer: str | None = None
    length_ratio: float = Field(ge=0.0)


def _check_prompt(turns: Sequence[ChatMessage]) -> None:
    if not turns or turns[-1].role != "user":
        raise ValueError("the prompt must end with a user turn")
    if any(t.role == "assistant" for t in turns):
        raise ValueError("the prompt must not hold assistant turns")


def _check_reply(turns: Sequence[ChatMessage], name: str) -> None:
    if len(turns) != 1 or turns[0].role != "assistant":
        raise ValueError(f"{name} must be exactly one assistant turn")


class MessagesRow(BaseModel):
    """SFT row in TRL's conversational ``messages`` form.

    Example:
        >>> MessagesRow(messages=[ChatMessage(role="user", content="1+1?"),
        ...                       ChatMessage(role="assistant", content="\\\\boxed{2}")],
        ...             metadata=example_provenance()).messages[0].role
        'user'
    """

    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage]
    metadata: Provenance

    @model_validator(mode="after")
    def _shape(self) -> MessagesRow:
        if len(self.messages) < 2:
            raise ValueError("messages needs a user turn and an assistant turn")
        _check_prompt(self.messages[:-1])
        _check_reply(self.messages[-1:], "the last message")
        return self


class PromptCompletionRow(BaseModel):
    """SFT row in TRL's conversational ``prompt``/``completion`` form (completion-only loss)."""

    model_config = ConfigDict(extra="forbid")

    prompt: list[ChatMessage]
    completion: list[ChatMessage]
    metadata: Provenance

    @model_validator(mode="after")
    def _shape(self) -> PromptCompletionRow:
        _check_prompt(self.prompt)
        _check_reply(self.completion, "completion")
        return self


class PairRow(BaseModel):
    """Preference row in TRL's conversational form.

    Example:
        >>> PairRow(prompt=[ChatMessage(role="user", content="1+1?")],
        ...         chosen=[ChatMessage(role="assistant", content="\\\\boxed{2}")],
        ...         rejected=[ChatMessage(role="assistant", content="\\\\boxed{3}")],
        ...         metadata=example_provenance(pair=True)).chosen[0].content
        '\\\\boxed{2}'
    """

    model_config = ConfigDict(extra="forbid")

    prompt: list[ChatMessage]
    chosen: list[ChatMessage]
    rejected: list[ChatMessage]
    metadata: PairProvenance

    @model_validator(mode="after")
    def _shape(self) -> PairRow:
        _check_prompt(self.prompt)
        _check_reply(self.chosen, "chosen")
        _check_reply(self.rejected, "rejected")
        if " ".join(self.chosen[0].content.split()) == " ".join(
                self.rejected[0].content.split()):
            raise ValueError("chosen and rejected are the same text")
        return self


class StepwiseProvenance(BaseModel):
    """Where a stepwise row came from: the search that grew the path, the path's answer
    and whether it is the gold one, and the step scorer's score of each step (None
    where the search did not score it: the step that completed the best path)."""

    model_config = ConfigDict(extra="forbid")

    source_run: str
    problem_id: str
    dataset: str | None = None
    strategy: str
    model: str = ""
    answer: str | None = None
    correct: bool
    scores: list[float | None]
    labels_from: Literal["outcome_tree"] = "outcome_tree"


class StepwiseRow(BaseModel):
    """Stepwise-supervision row: a prompt, a solution's steps, a label per step.

    Example:
        >>> StepwiseRow(prompt="2+3*4?", completions=["3*4 = 12", "2+12 = 14. \\boxed{14}"],
        ...             labels=[True, True], metadata={
        ...                 "source_run": "runs/beam", "problem_id": "q1", "strategy": "beam",
        ...                 "correct": True, "scores": [1.0, 1.0]}).labels
        [True, True]
    """

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    completions: list[str] = Field(min_length=1)
    labels: list[bool]
    metadata: StepwiseProvenance

    @model_validator(mode="after")
    def _shape(self) -> StepwiseRow:
        if len(self.labels) != len(self.completions) or len(
                self.metadata.scores) != len(self.completions):
            raise ValueError("a stepwise row needs one label and one score per step")
        for step in self.completions:
            leak = scaffold_leak(step)
            if not step.strip() or leak:
                raise ValueError(f"a step is empty or holds scaffolding ({leak or 'empty'})")
        return self


SFTRow = MessagesRow | PromptCompletionRow


def example_provenance(*, pair: bool = False, **changes: Any) -> dict[str, Any]:
    """A complete, valid provenance dict (for docs and tests)."""
    base: dict[str, Any] = {
        "source_run": "runs/example", "problem_id": "q1", "dataset": "arith", "level": 1,
        "run_strategy": "cot", "strategy": "cot", "step": "draft", "iteration": 0,
        "event_id": "e1", "verifier": "math", "model": DEFAULT_MODEL, "weight": 1.0,
        "rescued": False, "easy": False, "answer": "4"}
    if pair:
        base.update(pair_source="correct_incorrect", rejected_strategy="cot",
                    rejected_step="draft", rejected_iteration=0, rejected_event_id="e1",
                    rejected_answer="5", length_ratio=1.0)
    base.update(changes)
    return base


def validate_sft_row(row: dict[str, Any] | SFTRow) -> SFTRow:
    """Validate one SFT row (either TRL form).

    Raises:
        pydantic.ValidationError: the row does not match either form.
    """
    if isinstance(row, MessagesRow | PromptCompletionRow):
        row = row.model_dump()
    if isinstance(row, dict) and "messages" in row:
        return MessagesRow.model_validate(row)
    return PromptCompletionRow.model_validate(row)


def validate_pair_row(row: dict[str, Any] | PairRow) -> PairRow:
    """Validate one preference row.

    Raises:
        pydantic.ValidationError: the row is not a valid preference row.
    """
    if isinstance(row, PairRow):
        row = row.model_dump()
    return PairRow.model_validate(row)


def validate_stepwise_row(row: dict[str, Any] | StepwiseRow) -> StepwiseRow:
    """Validate one stepwise-supervision row.

    Raises:
        pydantic.ValidationError: the row is not a valid stepwise row.
    """
    if isinstance(row, StepwiseRow):
        row = row.model_dump()
    return StepwiseRow.model_validate(row)


RowKind = Literal["sft", "pair", "stepwise"]
_VALIDATORS = {"sft": validate_sft_row, "pair": validate_pair_row,
               "stepwise": validate_stepwise_row}


def write_rows(path: str | os.PathLike[str], rows: Iterable[BaseModel | dict[str, Any]],
               kind: RowKind) -> int:
    """Validate every row, then write them as JSONL atomically (temp file + rename).

    Returns the number of rows written. A crash leaves the old file (or none),
    never a half-written one.

    Raises:
        pydantic.ValidationError: a row is invalid (nothing is written).
    """
    validate = _VALIDATORS[kind]
    lines = [validate(r).model_dump_json() + "\n" for r in rows]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(lines)


def read_rows(path: str | os.PathLike[str], kind: RowKind) -> list[Any]:
    """Read and validate a JSONL of SFT, preference or stepwise rows.

    Raises:
        DistillError: missing file, bad JSON, an invalid row (with its line), or no rows.
    """
    p = Path(path)
    if not p.is_file():
        raise DistillError(f"{p} does not exist (build it with `refinery distill build`)")
    validate = _VALIDATORS[kind]
    rows = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(validate(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DistillError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from exc
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(x) for x in err["loc"])
                raise DistillError(f"{p}:{lineno}: not a valid {kind} row ({where}: "
                                   f"{err['msg']})") from exc
    if not rows:
        raise DistillError(f"{p} holds no {kind} rows (nothing to train on)")
    return rows
