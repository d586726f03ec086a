"""Verified programs -> worked solutions in words (program-aided distillation).

``pot`` finds verified answers on problems plain ``cot`` fails, but its
attempts are programs: training ``cot`` on them would teach the model to write
code where it is asked to reason. :func:`program_rationale` turns a verified
``def solution():`` program into the step-by-step solution ``cot`` is asked
for, one line per assignment with the values filled in, so the executed
program is the teacher and every number in the row is computed, not guessed.

The program is never executed here: its syntax tree is read and a small
arithmetic interpreter (numbers, names, ``+ - * / // % **``, ``round``,
``int``, ``abs``, ``min``, ``max``) evaluates it. A program outside that subset
gives no rationale (the row falls back to the program itself, or is skipped),
and the value it reaches must equal what the sandbox printed.

Source: Zhu et al. 2023, "PaD: Program-aided Distillation Can Teach Small
Models Reasoning Better than Chain-of-thought Fine-tuning".

Example:
    >>> print(program_rationale("def solution():\\n    pens = 5 * 12\\n"
    ...                         "    return pens - 17\\n"))
    pens = 5 × 12 = 60.
    pens - 17 = 60 - 17 = 43.
    The answer is \\boxed{43}.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from refinery.strategies.execution import normalize_number

__all__ = ["program_rationale"]

_OPS: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub),
    ast.Mult: ("×", operator.mul), ast.Div: ("÷", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv), ast.Mod: ("%", operator.mod),
    ast.Pow: ("^", operator.pow),
}
_CALLS: dict[str, Callable[..., Any]] = {"round": round, "int": int, "abs": abs,
                                         "min": min, "max": max}
_LIMIT = 1e15  # values past this are not arithmetic a word problem asks for


class _Unsupported(Exception):
    """The program leaves the arithmetic subset: no rationale."""


def _number(value: Any) -> str:
    return normalize_number(str(value))


def _eval(node: ast.expr, env: dict[str, Any]) -> tuple[Any, str, str]:
    """(value, the expression as written, the expression with values filled in)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value, _number(node.value), _number(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise _Unsupported(node.id)
        return env[node.id], node.id.replace("_", " "), _number(env[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v, s, f = _eval(node.operand, env)
        sign = "-" if isinstance(node.op, ast.USub) else ""
        return (-v if sign else v), f"{sign}{s}", f"{sign}{f}"
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        (a, sa, fa), (b, sb, fb) = _eval(node.left, env), _eval(node.right, env)
        sym, fn = _OPS[type(node.op)]
        if isinstance(node.op, ast.Pow) and (abs(b) > 10 or abs(a) > 1e6):
            raise _Unsupported("power")
        try:
            v = fn(a, b)
        except (ZeroDivisionError, OverflowError, ValueError) as e:
            raise _Unsupported(str(e)) from e
        return v, f"({sa} {sym} {sb})", f"({fa} {sym} {fb})"
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _CALLS and node.args and not node.keywords):
        parts = [_eval(a, env) for a in node.args]
        v = _CALLS[node.func.id](*(p[0] for p in parts))
        name = node.func.id
        return (v, f"{name}({', '.join(p[1] for p in parts)})",
                f"{name}({', '.join(p[2] for p in parts)})")
    raise _Unsupported(type(node).__name__)


def _bare(text: str) -> str:
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


def _line(label: str, node: ast.expr, env: dict[str, Any]) -> tuple[Any, str]:
    value, written, filled = _eval(node, env)
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)) or abs(value) > _LIMIT:
        raise _Unsupported("value")
    parts = [p for p in (label, _bare(written), _bare(filled), _number(value)) if p]
    parts = [p for i, p in enumerate(parts) if i == 0 or p != parts[i - 1]]
    return value, " = ".join(parts) + "."


def _solution_body(program: str) -> list[ast.stmt]:
    try:
        tree = ast.parse(program)
    except SyntaxError as e:
        raise _Unsupported("syntax") from e
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "solution"]
    if len(fns) != 1 or fns[0].args.args:
        raise _Unsupported("no solution()")
    return fns[0].body


def _render(program: str) -> tuple[str, Any]:
    env: dict[str, Any] = {}
    lines: list[str] = []
    for stmt in _solution_body(program):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            env[name], text = _line(name.replace("_", " "), stmt.value, env)
            lines.append(text)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            expr = ast.BinOp(left=ast.Name(id=name), op=stmt.op, right=stmt.value)
            env[name], text = _line(name.replace("_", " "), expr, env)
            lines.append(text)
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            if isinstance(stmt.value, ast.Name) and stmt.value.id in env:
                return "\n".join(lines), env[stmt.value.id]
            value, text = _line("", stmt.value, env)
            return "\n".join([*lines, text]), value
        elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            raise _Unsupported(type(stmt).__name__)  # a docstring is fine; anything else not
    raise _Unsupported("no return")


def program_rationale(program: str, answer: str | None = None) -> str | None:
    """The worked solution ``program`` stands for, or ``None`` outside the subset.

    ``answer`` (what the sandbox printed), when given, must be the value the
    rationale reaches: a program whose reading here disagrees with its run gives none.
    """
    try:
        body, value = _render(program)
    except (_Unsupported, RecursionError, TypeError):
        return None
    final = _number(value)
    if answer is not None and final != _number(answer):
        return None
    return "\n".join(p for p in (body, f"The answer is \\boxed{{{final}}}.") if p)
