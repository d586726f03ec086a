"""Plan-level SSR: check and repair the seed's plan, then run adaptive SSR."""

from __future__ import annotations

from collections.abc import Sequence

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context, Generation
from refinery.engine.errors import BudgetExhausted
from refinery.engine.trace import StepKind
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies import socratic
from refinery.strategies.base import record_parse, step_params, with_note
from refinery.strategies.spec import ChildCost
from refinery.strategies.ssr import SSR
from refinery.strategies.ssr_ada import SSRAda
from refinery.verifiers.judge import parse_score

SUMMARISE = """Problem:
{question}

Solution:
{solution}

Summarise the plan this solution follows as short numbered steps: what is worked out, \
in which order, from what. Do no arithmetic and give no computed numbers."""
CRITIQUE = """Problem:
{question}

Proposed plan:
{plan}

Critique the plan: is every step sound, is anything missing, is the order right? Then \
rate the plan from 0 (useless) to 5 (sound and complete). End with a line "Score: N"."""
REPLAN = """Problem:
{question}

Plan:
{plan}

Critique of the plan:
{critique}

Write an improved plan as short numbered steps that fixes what the critique found. Do no \
arithmetic and give no computed numbers."""
NOTE = "Follow this plan, computing every value yourself:\n{plan}"


class SSRPlan(SSRAda):
    """``ssr_plan(inner, max_iter=3)``: repair the plan first, then ``ssr_ada``.

    The seed's plan is summarised (no arithmetic), critiqued and scored 0-5.
    Below 5 (or unreadable), the model re-plans from the critique and the
    inner strategy solves again with the new plan in context; that
    trajectory seeds the ``ssr_ada`` rounds. Parameters as ``ssr``; in
    structured mode the plan critique is also constrained, to one paragraph
    then ``Score: 0..5`` (the plans themselves are free text, never parsed).

    Example:
        >>> attempt = await SSRPlan(CoT()).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["rounds"]  # doctest: +SKIP
        5
    """

    name = "ssr_plan"

    @staticmethod
    def worst_case(params: SSR.Params, children: Sequence[ChildCost]) -> int:
        child = children[0].calls
        # summarise + critique + re-plan, and one more inner solve with the plan
        return 3 + child + socratic.worst_case(params, child, adaptive=True)

    async def seed(self, task: Task, ctx: Context) -> Attempt:
        seed = await self.inner[0].solve(task, ctx.inner())
        try:
            return await self.replan(task, ctx, seed)
        except BudgetExhausted:  # keep the seed; the loop records the spent budget
            return seed

    async def ask(self, ctx: Context, prompt: str, step: StepKind, parents: list[str],
                  constraint: Constraint | None = None) -> Generation:
        params = step_params(ctx, constraint, temperature=0.0)
        return await ctx.generate([Message(role="user", content=prompt)], params, n=1,
                                  step=step, strategy=self.name, parents=parents)

    async def replan(self, task: Task, ctx: Context, seed: Attempt) -> Attempt:
        q, structured = task.question, self.structured(ctx)
        plan = await self.ask(ctx, SUMMARISE.format(question=q, solution=seed.text), "plan",
                              seed.events)
        crit = await self.ask(ctx, CRITIQUE.format(question=q, plan=plan[0].text), "critique",
                              [plan.event_id], socratic.JUDGE_FORM if structured else None)
        score = parse_score(crit[0].text, 0, 5).value
        record_parse(ctx, crit.event_id, "plan_critique", [score is not None],
                     structured=structured)
        eid = ctx.emit("critique", f"plan score {score}", strategy=self.name,
                       parents=[crit.event_id], plan_score=score)
        if score is not None and score >= 5:
            return seed
        better = await self.ask(ctx, REPLAN.format(question=q, plan=plan[0].text,
                                                   critique=crit[0].text), "plan", [eid])
        attempt = await self.inner[0].solve(with_note(task, NOTE.format(plan=better[0].text)),
                                            ctx.inner())
        return attempt.model_copy(update={"events": [*attempt.events, better.event_id]})
