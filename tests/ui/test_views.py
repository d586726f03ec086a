"""The trace explorer's tree and the runs plot, as data (the templates only draw them)."""

from __future__ import annotations

from refinery.engine.context import Budget
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Attempt, Completion, Usage
from refinery.eval.metrics import CostSummary, accuracy
from refinery.eval.report import RunReport
from refinery.ui.plot import accuracy_plot
from refinery.ui.traceview import MAX_EVENTS, call_tree, chosen_events, trace_view


def gen(eid: str, parents: list[str], *finishes: str, step: str = "draft") -> TraceEvent:
    comps = [Completion(text=f"{eid}-{i}", finish_reason=f, prompt_tokens=5, completion_tokens=3)
             for i, f in enumerate(finishes)]
    return TraceEvent(id=eid, kind="generation", step=step, strategy="cot", parents=parents,
                      completions=comps, usage=Usage(prompt_tokens=5, completion_tokens=6,
                                                     calls=1))


def step(eid: str, parents: list[str], name: str, **data) -> TraceEvent:
    return TraceEvent(id=eid, kind="step", step=name, strategy="sc", parents=parents,
                      data=data)


def nested_select_trace() -> Trace:
    """An outer select whose chosen candidate is an inner select of two drafts."""
    events = [gen("a", [], "stop"), gen("b", [], "loop"), gen("r", ["b"], "stop",
                                                              step="loop_retry"),
              step("inner", ["a"], "select", score=0.9), step("other", ["r"], "vote"),
              step("outer", ["inner", "other"], "select", score=0.75)]
    return Trace(task_id="t", strategy="sc(cot, n=2)", events=events,
                 attempt=Attempt(text="x", answer="4", events=["outer"]),
                 usage=Usage(prompt_tokens=10, completion_tokens=20, calls=3), seconds=1.234)


def test_chosen_follows_select_steps_through_nesting() -> None:
    trace = nested_select_trace()
    assert chosen_events(trace.events, {"outer"}) == {"inner", "other", "a"}


def test_tree_hangs_events_under_their_first_parent_and_marks_roles() -> None:
    roots = call_tree(nested_select_trace())
    assert [r.id for r in roots] == ["a", "b"]
    a, b = roots
    assert [c.id for c in a.children] == ["inner"]
    assert [c.id for c in a.children[0].children] == ["outer"]
    outer = a.children[0].children[0]
    assert outer.answer and not outer.chosen and outer.also_from == ["other"]
    assert outer.scores == {"score": "0.75"}
    assert b.loop and b.finish == ["loop"] and b.outputs[0].loop
    assert b.children[0].role == "loop_retry" and not b.children[0].loop
    assert a.chosen and a.prompt_tokens == 5 and a.completion_tokens == 6


def test_a_file_with_a_parent_cycle_still_renders_every_event_once() -> None:
    trace = Trace(task_id="t", events=[step("x", ["y"], "vote"), step("y", ["x"], "vote"),
                                       step("z", ["z", "x"], "vote")])
    roots = call_tree(trace)

    def ids(nodes):
        return [n.id for n in nodes] + [i for n in nodes for i in ids(n.children)]
    assert sorted(ids(roots)) == ["x", "y", "z"]


def test_budget_rows_are_used_against_limits_with_the_worst_case() -> None:
    view = trace_view(nested_select_trace(), Budget(max_calls=8, max_seconds=60))
    rows = {b.name: b for b in view.budget}
    assert (rows["calls"].used, rows["calls"].limit, rows["calls"].worst_case) == (3, 8, 1)
    assert (rows["tokens"].used, rows["tokens"].limit) == (30, None)
    assert (rows["seconds"].used, rows["seconds"].limit) == (1.23, 60)
    assert view.loops == 1 and view.answer == "4"


def test_a_passthrough_trace_has_no_worst_case() -> None:
    view = trace_view(Trace(task_id="t", strategy="passthrough"))
    assert view.budget[0].worst_case is None and view.roots == []


def report(strategy: str, tokens: float, passed: list[bool]) -> RunReport:
    return RunReport(name=strategy, path=strategy, strategy=strategy, dataset="d", model="m",
                     n=len(passed), accuracy=accuracy(passed), cost=CostSummary(tokens=tokens))


def test_plot_places_points_and_connects_the_front() -> None:
    runs = [report("cot", 100, [True, False, False, False]),
            report("sc", 800, [True, True, True, False]),
            report("bad", 900, [False, False, False, False])]
    plot = accuracy_plot(runs, ["r1", "r2", "r3"], "d")
    cot, sc, bad = plot.points
    assert cot.front and sc.front and not bad.front
    assert cot.x < sc.x < bad.x and sc.y < cot.y < bad.y  # higher accuracy is higher up
    assert sc.high <= sc.y <= sc.low  # the interval bar spans the point
    assert plot.front == f"{cot.x},{cot.y} {sc.x},{sc.y}"
    assert not plot.log_x and plot.y_ticks[0].label == "0%"
    assert all(plot.left <= p.x <= plot.right for p in plot.points)
    assert all(plot.top <= p.high and p.low <= plot.bottom for p in plot.points)


def test_plot_goes_log_when_tokens_span_more_than_20x() -> None:
    plot = accuracy_plot([report("a", 50, [True]), report("b", 5000, [True, False])],
                         ["a", "b"], "d")
    assert plot.log_x and [t.label for t in plot.x_ticks] == ["100", "1,000"]


def test_rows_list_the_tree_depth_first_and_close_what_they_open() -> None:
    view = trace_view(nested_select_trace())
    assert [(r.call.id, r.opens, r.closes) for r in view.rows] == [
        ("a", True, 0), ("inner", True, 0), ("outer", False, 2),
        ("b", True, 0), ("r", True, 0), ("other", False, 2)]


def test_a_trace_over_the_event_limit_has_no_tree_and_says_so() -> None:
    events = [step(f"s{i}", [f"s{i - 1}"] if i else [], "vote")
              for i in range(MAX_EVENTS + 1)]
    view = trace_view(Trace(task_id="t", events=events))
    assert view.rows == [] and view.roots == [] and view.events == MAX_EVENTS + 1
    assert view.too_many is not None and f"{MAX_EVENTS + 1:,} events" in view.too_many
