"""Monte Carlo tree search over solution steps, guided by a step scorer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Task
from refinery.strategies.spec import ChildCost
from refinery.strategies.step_search import SearchParams, StepPath, StepSearch


@dataclass
class Node:
    """One tree node: a partial solution, its place in the tree, and its statistics
    (``visits`` evaluated descendants, ``total`` their values summed)."""

    path: StepPath
    parent: int | None = None
    depth: int = 0
    children: list[int] = field(default_factory=list)
    visits: int = 0
    total: float = 0.0
    exhausted: bool = False  # nothing below is left to expand: finished or at max depth

    def uct(self, parent_visits: int, exploration: float) -> float:
        """Mean value plus the exploration bonus (UCT, Kocsis and Szepesvari 2006)."""
        mean = self.total / self.visits
        return mean + exploration * math.sqrt(math.log(parent_visits) / self.visits)


def select_leaf(tree: list[Node], exploration: float) -> list[int]:
    """The path of node indices from the root to the leaf to expand: at each expanded
    node, the child not exhausted with the highest UCT (the first on ties)."""
    chain = [0]
    while tree[chain[-1]].children:
        node = tree[chain[-1]]
        open_children = [c for c in node.children if not tree[c].exhausted]
        chain.append(max(open_children,
                         key=lambda c: tree[c].uct(node.visits, exploration)))
    return chain


def backpropagate(tree: list[Node], chain: list[int], values: Sequence[float]) -> None:
    """Each new child counts as one visit of the leaf and of every ancestor."""
    for i in chain:
        tree[i].visits += len(values)
        tree[i].total += sum(values)
    for i in reversed(chain):  # a node whose children are all exhausted is exhausted
        node = tree[i]
        node.exhausted = bool(node.children) and all(tree[c].exhausted for c in node.children)


def most_visited(tree: list[Node]) -> Node:
    """The leaf reached from the root by the most visited child at each node (the
    higher mean value on ties, then the first)."""
    node = tree[0]
    while node.children:
        node = max((tree[c] for c in node.children), key=lambda n: (n.visits, n.total / n.visits))
    return node


class MCTS(StepSearch):
    """``mcts(scorer="arith", simulations=8, expansions=3, exploration=1.0)``: a tree of
    partial solutions grown where UCT points.

    Each simulation (1) selects a leaf from the root, taking at each node the child
    with the highest mean value plus ``exploration * sqrt(ln N_parent / N_child)``;
    (2) expands it by sampling ``expansions`` next steps in one request (continuing
    the leaf's partial assistant turn); (3) evaluates each new child by the step
    scorer, its path's steps folded by ``aggregate`` (in place of rStar's random
    rollouts: the step scorer is the rollout's verdict, read at once); (4)
    backpropagates: every new child is one visit, with its value, of the leaf and
    all its ancestors. A child that states its answer (or is ``max_steps`` deep, the
    tree's depth bound) is not expanded again; the search ends after
    ``simulations`` expansions or when no node is left to expand. The answer is the
    finished path with the best score; with none, the leaf reached by the most
    visited children is completed in one more generation (as beam's best partial
    path is). Every simulation is one ``search`` trace event: the selected ``chain``
    of node indices (the root is 0, nodes numbered as created), the new ``children``
    and their ``scores``, and the chain's ``visits`` and ``means`` after
    backpropagation. A turn whose answer may be a tool call runs as ``cot``: a
    tool call is not grown a step at a time.

    Source: Kocsis and Szepesvari 2006 (UCT); Qi et al. 2024, "Mutual Reasoning Makes
    Smaller LLMs Stronger Problem-Solvers" (rStar); OptiLLM's ``mcts`` approach
    (simulations, exploration weight, depth, a few actions per expansion).

    Example:
        >>> attempt = await MCTS(scorer="arith", simulations=4).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["simulations"], attempt.answer  # doctest: +SKIP
        (4, '14')
    """

    name = "mcts"

    class Params(SearchParams):
        simulations: int = Field(8, ge=1, le=64, description="select-expand-evaluate rounds")
        expansions: int = Field(3, ge=1, le=16, description="next steps drawn per expansion")
        exploration: float = Field(1.0, ge=0.0, le=10.0, description="UCT exploration weight")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        judged = params.simulations * params.expansions if params.scorer == "judge" else 0
        return params.simulations + judged + 1  # the expansions, their judge, the completion

    def fanout(self, level: int) -> int:
        return self.params.expansions

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        p = self.params
        scorer, messages, params = self._setup(task, ctx)
        tree, exhausted, done = [Node(StepPath())], None, 0
        while done < p.simulations and not tree[0].exhausted:
            chain = select_leaf(tree, p.exploration)
            leaf = tree[chain[-1]]
            try:
                grown = await self._grow(task, ctx, messages, params, [leaf.path], scorer,
                                         leaf.depth)
            except BudgetExhausted as exc:
                exhausted = exc
                break
            values = [g.value(p.aggregate) for g in grown]
            for g, v in zip(grown, values, strict=True):
                leaf.children.append(len(tree))
                tree.append(Node(g, chain[-1], leaf.depth + 1, visits=1, total=v,
                                 exhausted=g.done or leaf.depth + 1 >= p.max_steps))
            backpropagate(tree, chain, values)
            self._record(ctx, leaf.depth, grown, grown, list(range(len(grown))),
                         simulation=done, chain=chain, children=list(leaf.children),
                         visits=[tree[i].visits for i in chain],
                         means=[round(tree[i].total / tree[i].visits, 4) for i in chain])
            done += 1
        finished = [n.path for n in tree if n.path.done]
        live = [] if finished or len(tree) == 1 else [most_visited(tree).path]
        attempt = await self._answer(ctx, messages, finished, live, exhausted)
        return attempt.model_copy(update={"metadata": {
            **attempt.metadata, "simulations": done, "nodes": len(tree)}})
