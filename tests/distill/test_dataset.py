"""Selection rules of refinery.distill.dataset on constructed traces and results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refinery.distill.dataset import (
    arith_solution,
    build,
    clean_solution,
    gold_sft_rows,
    load_candidates,
)
from refinery.distill.schema import DistillError, read_rows
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.types import Message
from refinery.eval.datasets import load_arith
from tests.distill._runs import Problem, gen, step, write_run

Q1 = "Ava has 3 apples. Ava buys 4 more apples. How many apples does Ava have now?"
Q2 = "Ben has 9 coins. Ben loses 4 coins. How many coins does Ben have now?"
Q3 = "Kara has 6 eggs. Kara finds 2 more eggs. How many eggs does Kara have now?"

RIGHT_1 = "Ava starts with 3 apples and buys 4 more, so 3 + 4 = 7. The answer is \\boxed{7}."
WRONG_1 = "Ava has 3 apples and 4 more makes 3 + 4 = 6. The answer is \\boxed{6}."


def refine_problem(pid: str = "p1", question: str = Q1, draft: str = WRONG_1,
                   refined: str = RIGHT_1, gold: str = "7") -> Problem:
    """critique_refine(cot): draft -> critique -> refine; the refinement is final."""
    events = [gen("d", "draft", draft, question=question),
              gen("c", "critique", "Correctness: 1 - wrong sum. Directive: redo the sum.",
                  parents=["d"], strategy="critique_refine"),
              step("ce", "critique", ["c"], "redo the sum", "critique_refine"),
              gen("r", "refine", refined, parents=["d", "c", "ce"], strategy="critique_refine"),
              step("s", "select", ["r"], "7", "critique_refine")]
    return Problem(pid, question, gold, events, final=refined, final_events=["s"])


def sc_problem(pid: str, question: str, texts: list[str], gold: str, *,
               finish: list[str] | str = "stop", final: str | None = None) -> Problem:
    """sc(cot, n=k): one generation event with k samples, then a vote."""
    events = [gen("g", "draft", texts, question=question, finish=finish),
              step("v", "vote", ["g"], gold, "sc")]
    return Problem(pid, question, gold, events, final=final or texts[0], final_events=["v"],
                   strategy="sc(cot, n=4)", score=0.75)


def sft_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assistant(row: dict) -> str:
    return row["messages"][-1]["content"]


def run_build(tmp_path: Path, problems: list[Problem], **kw) -> tuple:
    run = write_run(tmp_path, "run", problems)
    sft, pairs = tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl"
    stats = build([run], sft, pairs, **kw)
    return stats, sft_of(sft), sft_of(pairs)


# ------------------------------------------------------------------------------- cleaning


def test_clean_solution_strips_scaffold_and_keeps_the_answer() -> None:
    raw = ("<evaluation>In step 2 I added wrongly.</evaluation>\n"
           "Here is the corrected solution:\n"
           "Wait, in the sub-step \"sum\" I got 6, but re-checking it, it should be 7.\n"
           "3 + 4 = 7 apples.\n<answer>7</answer>")
    out = clean_solution(raw)
    assert out == "3 + 4 = 7 apples.\n\\boxed{7}"
    # Plain text inside answer tags when the text already boxes its answer.
    assert clean_solution("So \\boxed{7}. <answer>7</answer>") == "So \\boxed{7}. 7"
    # A <plan> block goes; nothing clean left -> None; a stray tag -> None.
    assert clean_solution("<plan>add</plan>3+4=7, \\boxed{7}") == "3+4=7, \\boxed{7}"
    assert clean_solution("<evaluation>only an evaluation</evaluation>   ") is None
    assert clean_solution("3 + 4 = 7 <answer>7") is None


# ------------------------------------------------------------------- rescue and refinement


def test_rescued_prompt_is_double_weighted_and_pairs_come_from_the_edge(tmp_path) -> None:
    stats, sft, pairs = run_build(tmp_path, [refine_problem()])
    assert stats.rescued == 1 and stats.easy == 0
    assert len(sft) == 1
    row = sft[0]
    assert assistant(row) == RIGHT_1
    assert row["messages"][0] == {"role": "user", "content": Q1}
    md = row["metadata"]
    assert md["weight"] == 2.0 and md["rescued"] is True
    assert (md["step"], md["iteration"], md["strategy"]) == ("refine", 1, "critique_refine")
    assert md["verifier"] == "eval:math"  # the final attempt keeps the runner's verdict
    assert md["source_run"].endswith("run") and md["problem_id"] == "p1"
    assert md["model"] == DEFAULT_MODEL and md["answer"] == "7"
    assert "gold" not in md  # the gold answer is for verification only
    # One preference pair, from the refinement edge: rejected is the wrong draft.
    assert len(pairs) == 1
    p = pairs[0]
    assert p["prompt"] == [{"role": "user", "content": Q1}]
    assert p["chosen"] == [{"role": "assistant", "content": RIGHT_1}]
    assert p["rejected"] == [{"role": "assistant", "content": WRONG_1}]
    assert p["metadata"]["pair_source"] == "refinement_edge"
    assert p["metadata"]["rejected_step"] == "draft" and p["metadata"]["rejected_answer"] == "6"
    assert p["metadata"]["weight"] == 2.0


def test_refinement_with_scaffold_is_cleaned_for_sft(tmp_path) -> None:
    ssr_out = ("<evaluation>The sum in step 1 is wrong: 3 + 4 is 7.</evaluation>\n"
               "Ava starts with 3 apples. She buys 4 more, so she has 3 + 4 = 7 apples.\n"
               "<answer>7</answer>")
    prob = refine_problem(refined=ssr_out)
    prob.final = "Ava starts with 3 apples. She buys 4 more, so she has 3 + 4 = 7 apples.\n" \
                 "<answer>7</answer>"  # what ssr returns: the text after </evaluation>
    stats, sft, _ = run_build(tmp_path, [prob])
    [row] = sft
    text = assistant(row)
    assert "<" not in text and "evaluation" not in text.lower()
    assert text.endswith("\\boxed{7}") and "3 + 4 = 7" in text


def test_no_instruction_by_default_and_cot_instruction_on_request(tmp_path) -> None:
    from refinery.strategies.cot import INSTRUCTION

    _, sft, pairs = run_build(tmp_path, [refine_problem()], instruction=INSTRUCTION)
    assert sft[0]["messages"][0]["content"] == f"{Q1}\n\n{INSTRUCTION}"
    assert pairs[0]["prompt"][0]["content"] == f"{Q1}\n\n{INSTRUCTION}"


# -------------------------------------------------------------------- all right / all wrong


def test_all_correct_prompt_gives_no_pair_and_one_down_weighted_example(tmp_path) -> None:
    texts = [RIGHT_1, "3 + 4 = 7, so \\boxed{7}.", "Adding: 7. The answer is \\boxed{7}.",
             "Ava now has 7 apples. \\boxed{7}"]
    stats, sft, pairs = run_build(tmp_path, [sc_problem("p1", Q1, texts, "7")])
    assert pairs == [] and stats.all_right == 1 and stats.easy == 1
    assert len(sft) == 1 and sft[0]["metadata"]["weight"] == 0.5
    assert sft[0]["metadata"]["easy"] is True


def test_all_wrong_prompt_is_dropped(tmp_path) -> None:
    texts = [WRONG_1, "3 + 4 = 8. \\boxed{8}"]
    stats, sft, pairs = run_build(tmp_path, [sc_problem("p1", Q1, texts, "7")])
    assert sft == [] and pairs == [] and stats.no_passing_attempt == 1


def test_correct_x_incorrect_pairs_capped_at_four(tmp_path) -> None:
    right = [f"Step {i}: 3 + 4 = 7. The answer is \\boxed{{7}}." for i in range(4)]
    wrong = [f"Step {i}: 3 + 4 = {8 + i}. The answer is \\boxed{{{8 + i}}}." for i in range(4)]
    stats, sft, pairs = run_build(tmp_path, [sc_problem("p1", Q1, right + wrong, "7")])
    assert len(pairs) == 4
    assert {p["metadata"]["pair_source"] for p in pairs} == {"correct_incorrect"}
    # Spread: four distinct chosen and four distinct rejected texts.
    assert len({p["chosen"][0]["content"] for p in pairs}) == 4
    assert len({p["rejected"][0]["content"] for p in pairs}) == 4
    for p in pairs:
        assert "\\boxed{7}" in p["chosen"][0]["content"]
        assert "\\boxed{7}" not in p["rejected"][0]["content"]
    assert len(sft) == 4 and all(r["metadata"]["weight"] == 1.0 for r in sft)


def test_length_bias_control_skips_long_chosen(tmp_path) -> None:
    long_right = ("Let us think carefully about every detail of the problem here. " * 4
                  + "3 + 4 = 7. The answer is \\boxed{7}.")
    short_wrong = "3 + 4 = 6. \\boxed{6}"
    stats, sft, pairs = run_build(tmp_path, [sc_problem("p1", Q1, [long_right, short_wrong],
                                                         "7")])
    assert pairs == [] and stats.pairs_skipped_length == 1
    assert len(sft) == 1  # the SFT example is unaffected
    # With the control relaxed, the pair is made and records its length ratio.
    stats, _, pairs = run_build(tmp_path / "b", [sc_problem("p1", Q1, [long_right, short_wrong],
                                                             "7")], max_length_ratio=100)
    assert len(pairs) == 1 and pairs[0]["metadata"]["length_ratio"] > 1.5


# ------------------------------------------------------------------ loops, truncation, form


def test_loop_flagged_attempt_never_becomes_sft_data(tmp_path) -> None:
    looped = "3 + 4 = 7. 3 + 4 = 7. 3 + 4 = 7. The answer is \\boxed{7}."
    prob = sc_problem("p1", Q1, [looped], "7", finish="loop")
    prob.finish = "loop"
    prob.passed = True  # even if the runner's verdict on the looping text was "right"
    stats, sft, pairs = run_build(tmp_path, [prob])
    assert sft == [] and pairs == []
    assert stats.dropped.get("loop") == 1 and stats.no_passing_attempt == 1


def test_loop_retry_of_a_looped_draft_is_usable(tmp_path) -> None:
    events = [gen("d", "draft", "3 + 4 = 3 + 4 = 3 + 4 =", question=Q1, finish="loop"),
              gen("lr", "loop_retry", RIGHT_1, parents=["d"])]
    prob = Problem("p1", Q1, "7", events, final=RIGHT_1, final_events=["lr"],
                   strategy="cot")
    stats, sft, _ = run_build(tmp_path, [prob])
    assert [assistant(r) for r in sft] == [RIGHT_1]
    assert sft[0]["metadata"]["step"] == "loop_retry"
    assert stats.rescued == 0  # a retry after a loop alarm is not a refinement rescue


def test_truncated_and_malformed_attempts_are_dropped(tmp_path) -> None:
    texts = ["3 + 4 = 7, so the total is \\boxed{7", "Ava has 3 + 4 apples which is 7",
             RIGHT_1, "<evaluation>3 + 4 = 7</evaluation>"]
    stats, sft, _ = run_build(tmp_path, [sc_problem("p1", Q1, texts, "7",
                                                    finish=["length", "stop", "stop", "stop"])])
    assert [assistant(r) for r in sft] == [RIGHT_1]
    assert stats.dropped["truncated"] == 1
    # "... which is 7" states no explicit answer; the bare evaluation leaves nothing.
    assert stats.dropped["malformed"] == 2
    # Implicit answers may be allowed explicitly.
    _, sft, _ = run_build(tmp_path / "b", [sc_problem("p1", Q1, texts, "7",
                                                      finish=["length", "stop", "stop",
                                                              "stop"])],
                          require_explicit_answer=False)
    assert len(sft) == 2


def test_duplicates_are_removed(tmp_path) -> None:
    texts = [RIGHT_1, RIGHT_1.upper().replace("\\BOXED", "\\boxed"), "  " + RIGHT_1 + "\n",
             WRONG_1]
    stats, sft, _ = run_build(tmp_path, [sc_problem("p1", Q1, texts, "7")])
    assert len(sft) == 1 and stats.dropped["duplicate"] == 2


def test_per_prompt_cap_favours_distinct_solutions(tmp_path) -> None:
    a = "First 3 apples, then 4 more: 3 + 4 = 7. The answer is \\boxed{7}."
    a_twin = "First 3 apples, then 4 more: 3 + 4 = 7. So the answer is \\boxed{7}."
    distinct = ["Counting on from 3 by four steps gives 7. \\boxed{7}",
                "Total equals start plus added, seven in all. The answer is \\boxed{7}.",
                "4 + 3 makes 7 apples altogether. \\boxed{7}",
                "She ends up holding 7 apples. The answer is \\boxed{7}."]
    texts = [a, a_twin, *distinct, WRONG_1]
    stats, sft, _ = run_build(tmp_path, [sc_problem("p1", Q1, texts, "7", final=a)])
    got = [assistant(r) for r in sft]
    assert len(got) == 4 and stats.capped == 2
    assert a in got and a_twin not in got  # the near-copy of a chosen text is left out


def test_prompt_with_no_passing_attempt_across_several_problems(tmp_path) -> None:
    probs = [refine_problem("p1"),
             sc_problem("p2", Q2, ["9 - 4 = 4. \\boxed{4}"], "5"),
             sc_problem("p3", Q3, ["6 + 2 = 8. \\boxed{8}", "6 + 2 = 9. \\boxed{9}"], "8")]
    stats, sft, pairs = run_build(tmp_path, probs)
    assert stats.problems == 3 and stats.no_passing_attempt == 1
    assert {r["metadata"]["problem_id"] for r in sft} == {"p1", "p3"}
    assert {p["metadata"]["problem_id"] for p in pairs} == {"p1", "p3"}


def test_runs_are_merged_by_prompt(tmp_path) -> None:
    r1 = write_run(tmp_path, "r1", [sc_problem("p1", Q1, [WRONG_1], "7")])
    r2 = write_run(tmp_path, "r2", [sc_problem("x9", Q1, [RIGHT_1], "7")])
    stats = build([r1, r2], tmp_path / "s.jsonl", tmp_path / "p.jsonl")
    assert stats.problems == 1 and stats.sft_rows == 1 and stats.pairs == 1
    [pair] = sft_of(tmp_path / "p.jsonl")
    assert pair["metadata"]["source_run"].endswith("r2")


# ------------------------------------------------------------------------------ no gold


def test_without_gold_signals_must_agree(tmp_path) -> None:
    texts = [RIGHT_1, "3 + 4 = 7 so \\boxed{7}", "It is 7. \\boxed{7}", WRONG_1]
    confident = sc_problem("p1", Q1, texts, None)
    confident.score = 0.9
    unsure = sc_problem("p2", Q3, ["6 + 2 = 8 \\boxed{8}", "6 + 2 = 8, \\boxed{8}",
                                   "8 eggs \\boxed{8}"], None)
    unsure.score = 0.5  # the strategy itself is not confident: no label
    run = write_run(tmp_path, "run", [confident, unsure], with_results=False)
    stats = build([run], tmp_path / "s.jsonl", tmp_path / "p.jsonl")
    sft = sft_of(tmp_path / "s.jsonl")
    assert {r["metadata"]["problem_id"] for r in sft} == {"p1"}
    assert {r["metadata"]["verifier"] for r in sft} == {"agreement"}
    assert all("\\boxed{7}" in assistant(r) for r in sft)
    pairs = sft_of(tmp_path / "p.jsonl")
    assert stats.pairs == 3  # each agreeing sample against the one that disagrees
    assert {p["rejected"][0]["content"] for p in pairs} == {WRONG_1}
    assert stats.dropped["unverified"] == 3


def _asked_with_another_instruction() -> Problem:
    prob = refine_problem()
    prob.events[0] = prob.events[0].model_copy(update={"messages": [
        Message(role="user", content=f"{Q1}\n\nThink it over, then box the answer.")]})
    return prob


def test_traces_alone_give_the_recorded_question_and_gold(tmp_path) -> None:
    run = write_run(tmp_path, "run", [_asked_with_another_instruction()], with_results=False,
                    record_task=True)
    stats = build([run], tmp_path / "s.jsonl", tmp_path / "p.jsonl")
    [row] = sft_of(tmp_path / "s.jsonl")
    assert row["messages"][0] == {"role": "user", "content": Q1}
    # the recorded gold verified the refinement: a rescued prompt, checked against "7"
    assert stats.rescued == 1 and assistant(row) == RIGHT_1
    assert row["metadata"]["verifier"] == "math"


def test_old_traces_without_a_task_record_still_load(tmp_path) -> None:
    run = write_run(tmp_path, "run", [refine_problem()], with_results=False)
    traces = run / "traces.jsonl"
    old = [json.loads(line) for line in traces.read_text().splitlines()]
    for line in old:
        del line["task"]  # written before traces kept their task
    traces.write_text("".join(json.dumps(line) + "\n" for line in old))
    [prob], _ = load_candidates([run])
    # the question is recovered by stripping cot's instruction off the draft's request
    assert prob.prompt == Q1 and prob.gold is None
    [prob], _ = load_candidates([write_run(tmp_path, "new", [_asked_with_another_instruction()],
                                           with_results=False, record_task=True)])
    assert prob.prompt == Q1 and prob.gold == "7"


# ------------------------------------------------------------------------------ output


def test_outputs_load_with_datasets_and_trl_sees_the_formats(tmp_path) -> None:
    from datasets import load_dataset
    from trl.data_utils import is_conversational

    probs = [refine_problem("p1"), sc_problem("p3", Q3, ["6 + 2 = 8. \\boxed{8}",
                                                        "6 + 2 = 9. \\boxed{9}"], "8")]
    run = write_run(tmp_path, "run", probs)
    build([run], tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl")
    sft = load_dataset("json", data_files=str(tmp_path / "sft.jsonl"), split="train")
    pairs = load_dataset("json", data_files=str(tmp_path / "pairs.jsonl"), split="train")
    assert len(sft) == 2 and set(sft.column_names) == {"messages", "metadata"}
    assert set(pairs.column_names) == {"prompt", "chosen", "rejected", "metadata"}
    assert is_conversational(sft[0]) and is_conversational(pairs[0])
    assert sft[0]["metadata"]["weight"] == 2.0
    # prompt/completion form
    build([run], tmp_path / "pc.jsonl", None, sft_format="prompt_completion")
    pc = load_dataset("json", data_files=str(tmp_path / "pc.jsonl"), split="train")
    assert set(pc.column_names) == {"prompt", "completion", "metadata"}
    assert pc[0]["completion"][0]["role"] == "assistant"
    assert len(read_rows(tmp_path / "pc.jsonl", "sft")) == 2


def test_missing_run_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(DistillError, match="does not exist"):
        build([tmp_path / "nope"], tmp_path / "s.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DistillError, match="neither traces.jsonl nor results.jsonl"):
        build([tmp_path / "empty"], tmp_path / "s.jsonl")


def test_results_only_run_uses_the_final_texts(tmp_path) -> None:
    run = write_run(tmp_path, "run", [sc_problem("p1", Q1, [RIGHT_1], "7")])
    (run / "traces.jsonl").unlink()
    stats = build([run], tmp_path / "s.jsonl")
    assert stats.sft_rows == 1 and sft_of(tmp_path / "s.jsonl")[0]["metadata"]["step"] == "final"


# ------------------------------------------------------------------------- gold fallback


def test_arith_gold_solutions_are_right_for_every_level() -> None:
    from refinery.verifiers.math import extract_answer

    examples = load_arith("train", limit=25)
    rows = gold_sft_rows(examples)
    assert len(rows) == 25
    for ex, row in zip(examples, rows, strict=True):
        text = row.messages[-1].content
        assert extract_answer(text) == ex.gold
        assert row.metadata.verifier == "gold" and row.metadata.step == "gold_solution"
    assert arith_solution("no start here", ["+1"], "2") is None


def test_code_runs_use_only_the_runners_verdicts(tmp_path) -> None:
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    draft = "```python\ndef add(a, b):\n    return a - b\n```"
    events = [gen("d", "draft", draft, question="Write add."),
              gen("r", "refine", code, parents=["d"], strategy="critique_refine")]
    prob = Problem("HumanEval/0", "Write add.", "return a + b", events, final=code,
                   final_events=["r"], passed=True)
    run = write_run(tmp_path, "run", [prob], dataset="humaneval")
    stats = build([run], tmp_path / "s.jsonl", tmp_path / "p.jsonl")
    [row] = sft_of(tmp_path / "s.jsonl")
    assert assistant(row) == code and row["metadata"]["verifier"] == "eval:code"
    assert stats.dropped == {"unverified": 1} and stats.pairs == 0  # the draft's fate is unknown
