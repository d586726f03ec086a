"""What each page shows, and how a page is rendered (escaped, behind a strict CSP).

Templates are Jinja2 with autoescaping on: model output, prompts, spec text and
file names reach the page as text, never as markup. The Content-Security-Policy
allows scripts and styles from ``/ui/static`` only, so even a tag that escaped
escaping would not run (no inline script, no event-handler attribute).

Pages that read run files or draw a trace are built and rendered in a worker
process (:func:`draw_page`, :mod:`refinery.ui.drawing`), or in worker threads when
the settings say so (:func:`off_loop`, at most :data:`RENDER_THREADS` at a time):
never on the event loop, and in a process of their own never holding the GIL the
server's other requests need.

Example:
    >>> render(request, "runs.html", page="runs", runs=list_runs(root))  # doctest: +SKIP
    <HTMLResponse 200>
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import ValidationError

from refinery.engine.errors import (
    InvalidRequestError,
    NotFoundError,
    RefineryError,
    RequestTooLargeError,
)
from refinery.engine.trace import Trace
from refinery.eval.runner import TRACES
from refinery.serving.clients import client_id
from refinery.ui.auth import ui_settings
from refinery.ui.drawing import DRAWER, PAGE_COST
from refinery.ui.files import stamp
from refinery.ui.plot import Plot, accuracy_plot
from refinery.ui.runs import (
    MAX_TRACE_BYTES,
    RunRow,
    find_trace,
    invalid_because,
    list_runs,
    problems,
    resolve_run,
    run_limits,
    run_row,
    trace_index,
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
RENDER_THREADS = 2
T = TypeVar("T")

env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                  undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
# A whole number without its ".0" (900.0 seconds reads 900), others as they are.
env.filters["qty"] = lambda x: int(x) if isinstance(x, float) and x.is_integer() else x


def render(request: Request, template: str, status: int = 200,
           headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
    """The page ``template`` with ``context`` (and the settings), with the page headers."""
    return HTMLResponse(render_html(template, ui_settings(request), **context),
                        status_code=status, headers={**HEADERS, **(headers or {})})


def render_html(template: str, settings: UISettings, **context: Any) -> bytes:
    """The page ``template`` with ``context`` and ``settings``, as UTF-8.

    Encoded so that any text shows: a lone surrogate (a JSON ``"\\ud800"`` in a file)
    is written as its escape instead of failing the page.
    """
    html = env.get_template(template).render(settings=settings, **context)
    return html.encode("utf-8", "backslashreplace")


async def draw_page(request: Request, draw: Callable[..., bytes], *args: Any,
                    cost: int = PAGE_COST) -> HTMLResponse:
    """The page ``draw(settings, *args)`` makes, drawn in the worker process as ``cost``
    of this client's share (in a worker thread when ``settings.draw_in_process`` is
    off)."""
    settings = ui_settings(request)
    if settings.draw_in_process:
        html = await DRAWER.draw(draw, settings, *args, cost=cost,
                                 client=client_id(request.scope))
    else:
        html = await off_loop(request, lambda: draw(settings, *args))
    return HTMLResponse(html, headers=HEADERS)


async def off_loop(request: Request, work: Callable[[], T]) -> T:
    """``work()`` in a worker thread, at most :data:`RENDER_THREADS` of the app's at once,
    so the event loop goes on serving while a page is read and drawn."""
    limiter = getattr(request.app.state, "render_limiter", None)
    if limiter is None:
        limiter = request.app.state.render_limiter = anyio.CapacityLimiter(RENDER_THREADS)
    return await anyio.to_thread.run_sync(work, limiter=limiter)


async def form_body(request: Request) -> bytes:
    """A posted form's body, unparsed (a large one is parsed off the loop).

    Raises:
        InvalidRequestError: not an urlencoded form.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise InvalidRequestError("expected a form (application/x-www-form-urlencoded)")
    return await request.body()


def parse_form(body: bytes) -> dict[str, str]:
    """A form body's fields (the last value of each).

    Raises:
        InvalidRequestError: not UTF-8, or more than :data:`MAX_FORM_FIELDS` fields.
    """
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True,
                          max_num_fields=MAX_FORM_FIELDS, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequestError(f"unreadable form: {exc}") from None
    return {k: v[-1] for k, v in fields.items()}


async def form_fields(request: Request) -> dict[str, str]:
    """A posted (small) form's fields: :func:`form_body`, then :func:`parse_form`."""
    return parse_form(await form_body(request))


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
    """The runs list, one accuracy-vs-tokens plot per dataset, and the notes on the runs'
    files."""
    if settings.runs is None:
        return {"runs": [], "plots": [], "root": None, "notes": []}
    runs = list_runs(settings.runs)
    return {"runs": runs, "plots": plots(runs), "root": str(settings.runs),
            "notes": [n for r in runs for n in r.notes]}


def plots(runs: list[RunRow]) -> list[Plot]:
    by_dataset: dict[str, list[RunRow]] = defaultdict(list)
    for r in runs:
        if r.report is not None and r.report.n:
            by_dataset[r.report.dataset].append(r)
    return [accuracy_plot([r.report for r in group if r.report], [r.name for r in group],
                          f"{dataset}: accuracy vs. tokens per problem")
            for dataset, group in sorted(by_dataset.items())]


def run_page(settings: UISettings, name: str) -> dict[str, Any]:
    """One run: its numbers, its problems, and the notes on its files."""
    root = runs_root(settings)
    run = resolve_run(root, name)
    found, notes = problems(root, run, name)
    return {"name": name, "row": run_row(root, run, name), "problems": found, "notes": notes}


def run_trace_page(settings: UISettings, name: str, task: str) -> dict[str, Any]:
    """A problem's trace, against the run's per-problem budget."""
    root = runs_root(settings)
    run = resolve_run(root, name)
    limits, worst_case, notes = run_limits(root, run, name)
    view = trace_view(find_trace(root, run, task, name), limits, worst_case)
    skipped = [f"run {name}: {note}" for note in trace_index(root, run / TRACES).notes]
    return {"view": view, "run": name, "source": f"run {name}", "notes": notes + skipped}


def draw_runs(settings: UISettings) -> bytes:
    """The runs list (a :func:`draw_page` drawing)."""
    return render_html("runs.html", settings, page="runs", **runs_page(settings))


def draw_run(settings: UISettings, name: str) -> bytes:
    """One run's page (a :func:`draw_page` drawing)."""
    return render_html("run.html", settings, page="runs", **run_page(settings, name))


def run_trace_cost(settings: UISettings, name: str) -> int:
    """What drawing a trace of run ``name`` may parse: its traces file, up to the
    largest line the page reads (the page's own cost when there is none)."""
    try:
        root = runs_root(settings)
        found = stamp(root, resolve_run(root, name) / TRACES)
    except RefineryError:  # the drawing says what is wrong
        return PAGE_COST
    return PAGE_COST + min(found.size if found else 0, MAX_TRACE_BYTES)


def draw_run_trace(settings: UISettings, name: str, task: str) -> bytes:
    """The page of a run's problem's trace (a :func:`draw_page` drawing)."""
    return render_html("trace.html", settings, page="trace",
                       **run_trace_page(settings, name, task))


def draw_posted_trace(settings: UISettings, body: bytes) -> bytes:
    """The page of a trace posted in a form's ``body`` (a :func:`draw_page` drawing)."""
    return render_html("trace.html", settings, page="trace",
                       **posted_trace_page(settings, parse_form(body)))


def posted_trace_page(settings: UISettings, fields: dict[str, str]) -> dict[str, Any]:
    """A trace sent by the page: the playground's last answer (``source=playground``:
    shown against this server's per-request caps, which it ran under) or one pasted in
    (limits unknown). Parsed by pydantic's JSON parser, which refuses nesting deeper
    than it can handle with an error, not a crash.

    Raises:
        InvalidRequestError: the ``trace`` field is not a trace.
    """
    text = fields.get("trace", "").strip()
    if len(text) > MAX_TRACE_BYTES:  # characters: at least as many bytes
        raise RequestTooLargeError(f"a trace of {len(text):,} characters is over the page's "
                                   f"limit of {MAX_TRACE_BYTES:,} bytes, that of a run's "
                                   "trace line too", param="trace")
    try:
        trace = Trace.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidRequestError(f"not a refinery trace (one JSON object): "
                                  f"{invalid_because(exc)[:200]}", param="trace") from None
    playground = fields.get("source") == "playground"
    limits = settings.limits if playground else None
    return {"view": trace_view(trace, limits), "run": None, "notes": [],
            "source": "the playground" if playground else "pasted"}
