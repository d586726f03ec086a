"""Loop detector: figures on the committed labelled set, and its calibration.

The labelled set (``data/loops/``, made by ``scripts/make_loop_set.py``) holds real
SmolLM2-135M generations on GSM8K prompts with each token's text, so every
generation is streamed through a monitor exactly as the backend would: one model
token per ``feed``.

Printed on the held-out half: precision, recall, mean detection delay in tokens
(alarm token minus the labelled onset token; negative = before the loop became a
64-token repeat), onset error (tokens between ``alarm.onset`` and the labelled
onset), and the share of tokens saved in looping generations (tokens after the
alarm over all tokens of the looping generations; a missed loop saves nothing).
Then the false alarms on the 1,319 GSM8K test gold solutions (streamed in
SmolLM2 tokens, with and without the ``<<...>>`` calculator notes) and the CPU
cost of ``feed`` per token.

``--e2e`` measures the saving where it is spent: the held-out greedy prompts are
generated again through the real ``VLLMBackend`` at a larger cap, once without and
once with the monitor, and the tokens actually generated are compared. The labelled
set was made with a 512-token cap, so its looping generations hold at most 512
tokens and a loop that starts at token ~200 can save at most ~60% there; with a
bigger cap an unwatched loop runs on to it and the same alarm saves more.

``--data data/loops-1024`` reads the same prompts generated with a 1024-token cap
(labelled by the same rule); ``--data data/loops-test --split test`` the fresh test
set (other prompts, 1024 cap) that the frozen detector was run on once.

Usage:
    python bench/loops.py                        # held-out figures
    python bench/loops.py --data data/loops-1024 # the same at the 1024-token cap
    python bench/loops.py --data data/loops-test --split test  # the untouched test set
    python bench/loops.py --calibrate            # grid search on the calibration half
    python bench/loops.py --calibrate --data data/loops-1024 --calibrate-on calibration \
        heldout --word-shares 0.5 0.4 0.34 --ngrams 20 24 28 32  # the 1024-cap check
    python bench/loops.py --e2e --max-tokens 1024  # monitor off vs on, real engine
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from refinery.engine.loops import CusumLoopDetector, LoopAlarm  # noqa: E402
from refinery.eval.datasets import gsm8k_file  # noqa: E402

DATA = ROOT / "data" / "loops"
GSM8K_TEST = gsm8k_file("test")
_CHUNK = re.compile(r"\s*\S+|\s+")  # word-sized chunks when no tokenizer is at hand


def load(split: str, data: Path = DATA) -> list[dict]:
    """Rows of ``{data}/{split}.jsonl`` with ``pieces``: each token's text."""
    rows = [json.loads(line) for line in (data / f"{split}.jsonl").open()]
    for r in rows:
        pos, pieces = 0, []
        for n in r["token_lens"]:
            pieces.append(r["text"][pos : pos + n])
            pos += n
        r["pieces"] = pieces
    return rows


def stream(det: CusumLoopDetector, pieces: list[str]) -> tuple[LoopAlarm | None, int]:
    """Feed ``pieces`` one by one; return the alarm and how many pieces were fed."""
    mon = det.start()
    for i, p in enumerate(pieces, 1):
        if mon.feed(p) is not None:
            return mon.alarm, i
    return None, len(pieces)


def char_to_token(row: dict, char: int) -> int:
    """Index of the token holding ``char``."""
    pos = 0
    for i, n in enumerate(row["token_lens"]):
        pos += n
        if pos > char:
            return i
    return len(row["token_lens"])


@dataclass
class Figures:
    tp: int
    fp: int
    fn: int
    tn: int
    delay: float  # mean tokens from the labelled onset to the alarm, over true alarms
    onset_error: float  # mean |alarm.onset - labelled onset| in tokens
    saved: float  # tokens after the alarm / all tokens, over looping generations

    @property
    def precision(self) -> float:
        return self.tp / max(1, self.tp + self.fp)

    @property
    def recall(self) -> float:
        return self.tp / max(1, self.tp + self.fn)

    def line(self) -> str:
        return (f"precision {self.precision:.3f} ({self.tp}/{self.tp + self.fp})  "
                f"recall {self.recall:.3f} ({self.tp}/{self.tp + self.fn})  "
                f"delay {self.delay:+.1f} tok  onset error {self.onset_error:.1f} tok  "
                f"tokens saved {self.saved:.1%}")


def evaluate(det: CusumLoopDetector, rows: list[dict]) -> Figures:
    tp = fp = fn = tn = 0
    delays, errors = [], []
    saved = total = 0
    for r in rows:
        alarm, fed = stream(det, r["pieces"])
        if r["label"]:
            total += r["n_tokens"]
            if alarm is None:
                fn += 1
                continue
            tp += 1
            # The alarm came with the fed-th token: token index fed - 1.
            delays.append(fed - 1 - r["onset_token"])
            errors.append(abs(char_to_token(r, alarm.onset) - r["onset_token"]))
            saved += r["n_tokens"] - fed
        elif alarm is None:
            tn += 1
        else:
            fp += 1
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    return Figures(tp, fp, fn, tn, mean(delays), mean(errors), saved / max(1, total))


def gold_solutions(strip_notes: bool = False) -> list[str]:
    rows = [json.loads(line) for line in GSM8K_TEST.open()]
    texts = [r["answer"] for r in rows]
    return [re.sub(r"<<[^>]*>>", "", t) for t in texts] if strip_notes else texts


def token_chunker():
    """Split text into SmolLM2 token texts (falls back to word-sized chunks)."""
    try:
        from transformers import AutoTokenizer

        from refinery.engine.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model())

        def chunks(text: str) -> list[str]:
            offs = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ends = [e for _, e in offs["offset_mapping"]]
            starts = [0, *ends[:-1]]
            return [text[a:b] for a, b in zip(starts, ends, strict=True)] + [text[ends[-1]:]]

        return chunks, "SmolLM2 tokens"
    except Exception as e:  # the bench must still run without the model
        print(f"(no tokenizer: {e}; chunking by words)", file=sys.stderr)
        return _CHUNK.findall, "word chunks"


def gold_false_alarms(det: CusumLoopDetector, texts: list[str], chunks) -> list[int]:
    return [i for i, t in enumerate(texts) if stream(det, chunks(t))[0] is not None]


def feed_cost(det: CusumLoopDetector, rows: list[dict]) -> float:
    """CPU microseconds per ``feed`` call (one model token), over all rows."""
    n = sum(len(r["pieces"]) for r in rows)
    t0 = time.perf_counter()
    for r in rows:
        mon = det.start()
        for p in r["pieces"]:
            if mon.feed(p) is not None:
                mon = det.start()  # keep monitoring: cost per token of a live monitor
    return (time.perf_counter() - t0) / n * 1e6


# --- calibration ----------------------------------------------------------------


def peak_trace(det: CusumLoopDetector, pieces: list[str]) -> list[float]:
    """``S``'s running maximum after each token (``det.h`` must be out of reach)."""
    mon, out = det.start(), []
    for p in pieces:
        mon.feed(p)
        out.append(mon.peak)
    return out


def calibrate(rows: list[dict], gold: list[str], min_precision: float = 0.95,
              margin: float = 2.0, word_shares: tuple[float, ...] = (0.5,),
              ngrams: tuple[int, ...] = (8, 12, 16, 20, 24, 28, 32)) -> dict:
    """Grid search on ``rows`` (the calibration half) for ngram, k and h.

    ``mu`` is measured, per ngram: the share of repeated units in the clean (label 0)
    rows. Then for each ngram and drift ``mu + k``, every integer ``h`` at least
    ``margin`` above the highest ``S`` reached on a gold solution is scored robustly:
    precision at ``h - margin`` must be >= ``min_precision`` (a lower h alarms more),
    and the score is recall, then tokens saved, at ``h + margin`` (a higher h alarms
    less and later). The chosen setting sits inside a plateau, not on its edge.
    """
    clean = [r for r in rows if not r["label"]]
    positives = sum(r["label"] for r in rows)
    total = sum(r["n_tokens"] for r in rows if r["label"])
    best: tuple | None = None
    mus: dict[tuple[int, float], float] = {}
    grid = itertools.product(ngrams, (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8), word_shares)
    for ngram, drift, share in grid:
        if (ngram, share) not in mus:
            units = rep = 0
            for r in clean:
                mon = CusumLoopDetector(ngram=ngram, h=1e9, word_share=share).start()
                mon.feed(r["text"] + "\n\n")
                units, rep = units + mon.n_units, rep + mon.n_repeated
            mus[ngram, share] = round(rep / units, 3)
        mu = mus[ngram, share]
        k = round(drift - mu, 3)
        det = CusumLoopDetector(ngram=ngram, mu=mu, k=k, h=1e9, word_share=share)
        gold_peak = 0.0
        for t in gold:
            mon = det.start()
            mon.feed(t + "\n\n")
            gold_peak = max(gold_peak, mon.peak)
        traces = [peak_trace(det, r["pieces"]) for r in rows]

        def score(h: float, traces=traces) -> tuple[float, float, float]:
            tp = fp = saved = 0
            for r, tr in zip(rows, traces, strict=True):
                if not tr or tr[-1] <= h:
                    continue
                if r["label"]:
                    tp += 1
                    saved += r["n_tokens"] - (next(i for i, s in enumerate(tr) if s > h) + 1)
                else:
                    fp += 1
            return tp / max(1, tp + fp), tp / positives, saved / total

        for h in range(int(gold_peak + margin) + 1, 61):
            if score(h - margin)[0] < min_precision:
                continue
            _, recall, saved = score(h + margin)
            if best is None or (recall, saved) > best[0]:
                best = ((recall, saved), dict(ngram=ngram, mu=mu, k=k, h=float(h),
                                              word_share=share))
        print(f"ngram={ngram:2d} drift={drift:.2f} share={share:.2f} "
              f"gold peak {gold_peak:5.2f}  best so far "
              f"{best and best[1]} (recall, saved at h+{margin}) {best and best[0]}", flush=True)
    if best is None:
        raise SystemExit("no setting meets the precision floor")
    return best[1]


async def e2e(held: list[dict], questions: list[str], max_tokens: int) -> None:
    """Held-out greedy prompts through the real backend, monitor off vs on."""
    from refinery.engine.backends.vllm import VLLMBackend
    from refinery.engine.models import DEFAULT_MODEL
    from refinery.engine.types import Message, SamplingParams

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_loop_set import PROMPT, repeat_onset

    greedy = [r for r in held if r["sampling"] == "greedy"]
    backend = await VLLMBackend.create(DEFAULT_MODEL)
    tok = backend.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    async def one(r: dict, stop_rule: CusumLoopDetector | None):
        msgs = [Message(role="user", content=PROMPT.format(question=questions[r["prompt_id"]]))]
        [c] = await backend.generate(msgs, params, n=1, stop_rule=stop_rule)
        return c

    try:
        off = await asyncio.gather(*(one(r, None) for r in greedy))
        on = await asyncio.gather(*(one(r, CusumLoopDetector()) for r in greedy))
    finally:
        await backend.aclose()
    looping = [i for i, c in enumerate(off)
               if repeat_onset([tok.decode([t]) for t in tok.encode(c.text)]) is not None]
    clean = [i for i in range(len(off)) if i not in set(looping)]
    t_off = sum(off[i].completion_tokens for i in looping)
    t_on = sum(on[i].completion_tokens for i in looping)
    caught = sum(on[i].finish_reason == "loop" for i in looping)
    false_alarms = sum(on[i].finish_reason == "loop" for i in clean)
    print(f"e2e, greedy, cap {max_tokens}: {len(greedy)} held-out prompts, {len(looping)} loop "
          f"without the monitor (64-token repeat rule), {caught} of them stopped by it")
    print(f"  tokens generated in those looping generations: {t_off} without, {t_on} with the "
          f"monitor -> tokens saved {1 - t_on / max(1, t_off):.1%}")
    print(f"  clean generations: {len(clean)}, stopped as loops (false alarms): {false_alarms}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true",
                    help="grid search on the --calibrate-on splits")
    ap.add_argument("--data", type=Path, default=DATA, help="directory of the labelled set")
    ap.add_argument("--split", default="heldout", help="split reported on")
    ap.add_argument("--calibrate-on", nargs="+", default=["calibration"], metavar="SPLIT",
                    help="splits the grid search runs on")
    ap.add_argument("--word-shares", nargs="+", type=float, default=[0.5], metavar="S",
                    help="word_share values in the grid")
    ap.add_argument("--ngrams", nargs="+", type=int, default=[8, 12, 16, 20, 24, 28, 32],
                    metavar="N", help="ngram values in the grid")
    ap.add_argument("--e2e", action="store_true", help="monitor off vs on through vLLM")
    ap.add_argument("--max-tokens", type=int, default=1024, help="cap for --e2e")
    args = ap.parse_args()
    if args.e2e:
        rows = load(args.split, args.data)
        # Rows made from train prompts carry "gsm8k-train-" ids (make_loop_set --source).
        source = GSM8K_TEST.with_name("train.jsonl") if rows[0]["id"].startswith(
            "gsm8k-train-") else GSM8K_TEST
        questions = [json.loads(line)["question"] for line in source.open()]
        asyncio.run(e2e(rows, questions, args.max_tokens))
        return
    if args.calibrate:
        calib = [r for split in args.calibrate_on for r in load(split, args.data)]
        params = calibrate(calib, gold_solutions() + gold_solutions(True),
                           word_shares=tuple(args.word_shares), ngrams=tuple(args.ngrams))
        print("chosen:", params)
        print("calibration:", evaluate(CusumLoopDetector(**params), calib).line())
        return

    det = CusumLoopDetector()
    print("detector:", det.model_dump())
    held = load(args.split, args.data)
    n_loop = sum(r["label"] for r in held)
    print(f"{args.split}: {len(held)} generations, {n_loop} looping")
    print(f"{args.split}:", evaluate(det, held).line())
    loops = [r for r in held if r["label"]]
    tokens = sum(r["n_tokens"] for r in loops)
    after = sum(r["n_tokens"] - r["onset_token"] for r in loops) / tokens
    after64 = sum(max(0, r["n_tokens"] - r["onset_token"] - 64) for r in loops) / tokens
    print(f"  bound on tokens saved: {after:.1%} of looping tokens lie after the labelled "
          f"onset, {after64:.1%} more than 64 tokens after it (what a detector that waits "
          f"for the label's own evidence can save)")
    for sampling in sorted({r["sampling"] for r in held}):
        part = [r for r in held if r["sampling"] == sampling]
        print(f"  {sampling:7s}", evaluate(det, part).line())
    chunks, how = token_chunker()
    for strip in (False, True):
        texts = gold_solutions(strip)
        fa = gold_false_alarms(det, texts, chunks)
        notes = "without" if strip else "with"
        print(f"GSM8K test gold solutions ({how}, {notes} <<calc>> notes): "
              f"{len(fa)} false alarms of {len(texts)} {fa[:10] if fa else ''}")
    print(f"feed cost: {feed_cost(det, held):.2f} us per token (CPU, one stream)")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
