"""What each page shows, and how a page is rendered (escaped, behind a strict CSP).

Templates are Jinja2 with autoescaping on: model output, prompts, spec text and
file names reach the page as text, never as markup. The Content-Security-Policy
allows scripts and styles from ``/ui/static`` only, so even a tag that escaped
escaping would not run (no inline script, no event-handler attribute).

Example:
    >>> render(request, "runs.html", page="runs", runs=list_runs(root))
    <HTMLResponse 200>
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import ValidationError

from refinery.engine.errors import InvalidRequestError, NotFoundError
from refinery.engine.trace import Trace
from refinery.ui.auth import ui_settings
from refinery.ui.plot import Plot, accuracy_plot
from refinery.ui.runs import (
    RunRow,
    find_trace,
    list_runs,
    problems,
    resolve_run,
    run_limits,
    run_row,
)
from refinery.ui.settings import UISettings
from refinery.ui.traceview import trace_view

HERE = Path(__file__).resolve().parent
TEMPLATES, STATIC = HERE / "templates", HERE / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
           "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
           "Cross-Origin-Resource-Policy": "same-origin"}
MAX_FORM_FIELDS = 8

env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                  undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
# A whole number without its ".0" (900.0 seconds reads 900), others as they are.
env.filters["qty"] = lambda x: int(x) if isinstance(x, float) and x.is_integer() else x


def render(request: Request, template: str, status: int = 200,
           headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
    """The page ``template`` with ``context`` (and the settings), with the page headers.

    Encoded so that any text shows: a lone surrogate (a JSON ``"\\ud800"`` in a file)
    is written as its escape instead of failing the page.
    """
    html = env.get_template(template).render(settings=ui_settings(request), **context)
    return HTMLResponse(html.encode("utf-8", "backslashreplace"), status_code=status,
                        headers={**HEADERS, **(headers or {})})


async def form_fields(request: Request) -> dict[str, str]:
    """A posted form's fields (the last value of each).

    Raises:
        InvalidRequestError: not an urlencoded form, or not UTF-8.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise InvalidRequestError("expected a form (application/x-www-form-urlencoded)")
    try:
        text = (await request.body()).decode("utf-8")
        fields = parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS,
                          errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequestError(f"unreadable form: {exc}") from None
    return {k: v[-1] for k, v in fields.items()}


def runs_root(settings: UISettings) -> Path:
    """The runs directory.

    Raises:
        NotFoundError: the server was started without ``--runs``.
    """
    if settings.runs is None:
        raise NotFoundError("this server was started without a runs directory "
                            "(refinery serve --runs DIR, or refinery ui --runs DIR)")
    return settings.runs


def runs_page(settings: UISettings) -> dict[str, Any]:
    """The runs list and one accuracy-vs-tokens plot per dataset."""
    if settings.runs is None:
        return {"runs": [], "plots": [], "root": None}
    runs = list_runs(settings.runs)
    return {"runs": runs, "plots": plots(runs), "root": str(settings.runs)}


def plots(runs: list[RunRow]) -> list[Plot]:
    by_dataset: dict[str, list[RunRow]] = defaultdict(list)
    for r in runs:
        if r.report is not None and r.report.n:
            by_dataset[r.report.dataset].append(r)
    return [accuracy_plot([r.report for r in group if r.report], [r.name for r in group],
                          f"{dataset}: accuracy vs. tokens per problem")
            for dataset, group in sorted(by_dataset.items())]


def run_page(settings: UISettings, name: str) -> dict[str, Any]:
    """One run: its numbers and its problems."""
    run = resolve_run(runs_root(settings), name)
    return {"name": name, "row": run_row(run, name), "problems": problems(run)}


def run_trace_page(settings: UISettings, name: str, task: str) -> dict[str, Any]:
    """A problem's trace, against the run's per-problem budget."""
    run = resolve_run(runs_root(settings), name)
    limits, worst_case = run_limits(run)
    view = trace_view(find_trace(run, task), limits, worst_case)
    return {"view": view, "run": name, "source": f"run {name}"}


def posted_trace_page(settings: UISettings, fields: dict[str, str]) -> dict[str, Any]:
    """A trace sent by the page: the playground's last answer (``source=playground``:
    shown against this server's per-request caps, which it ran under) or one pasted in
    (limits unknown).

    Raises:
        InvalidRequestError: the ``trace`` field is not a trace.
    """
    text = fields.get("trace", "").strip()
    try:
        trace = Trace.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0][:200]
        raise InvalidRequestError(f"not a refinery trace (one JSON object): {first}",
                                  param="trace") from None
    playground = fields.get("source") == "playground"
    limits = settings.limits if playground else None
    return {"view": trace_view(trace, limits), "run": None,
            "source": "the playground" if playground else "pasted"}
