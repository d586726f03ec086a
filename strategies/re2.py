"""Re-reading (RE2): the question is shown twice before the model reasons about it."""

from __future__ import annotations

from refinery.engine.types import Message, Task
from refinery.strategies.base import with_question
from refinery.strategies.cot import CoT

REREAD = "Read the question again: {question}"


class ReRead(CoT):
    """``re2(temperature=None)``: chain of thought on a question stated twice.

    Steps: the last user turn keeps the question, then repeats it after "Read
    the question again:", then the step-by-step instruction of ``cot`` follows;
    one generation, answer extracted as cot's. A decoder-only model reads the
    prompt left to right, so on the second pass every token of the question can
    attend to the whole first copy: a cheap stand-in for bidirectional reading.

    It is a cot variant: at the root its generation streams as the answer, and
    ``sc(re2, n=5)``, ``best_of_n(re2)`` and ``moa(re2)`` draw all their samples
    in one request (``sample``), each with the re-read prompt.

    Source: Xu et al. 2023, "Re-Reading Improves Reasoning in Large Language
    Models" (RE2); OptiLLM's ``re2`` approach.

    Example:
        >>> attempt = await ReRead().solve(Task.from_prompt("2 + 3 * 4?"), ctx)  # doctest: +SKIP
        >>> # prompt: "2 + 3 * 4?\\n\\nRead the question again: 2 + 3 * 4?\\n\\nWork through..."
        >>> attempt.answer  # doctest: +SKIP
        '14'
    """

    name = "re2"

    class Params(CoT.Params):
        """cot's parameters; the instruction follows the second reading."""

    def messages(self, task: Task) -> list[Message]:
        reread = with_question(task.messages, REREAD.format(question=task.question))
        if not self.params.instruction:
            return reread
        return with_question(reread, self.params.instruction)
