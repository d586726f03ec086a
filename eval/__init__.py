"""Evaluation: datasets, lm-eval-compatible metrics, a resumable runner and reports.

Imports engine, verifiers and strategies only.

Example:
    >>> from refinery.eval import EvalConfig, run_eval, write_report
    >>> summary = await run_eval(EvalConfig(  # doctest: +SKIP
    ...     dataset="arith", strategy="cot", limit=20, out="runs/cot-arith"))
    >>> write_report(["runs/cot-arith"], "docs", name="arith")  # doctest: +SKIP
    >>> # the same run on 4 Ray actors, one engine each
    >>> await run_eval(EvalConfig(  # doctest: +SKIP
    ...     ..., ray=RayOptions(address="auto", replicas=4)))
"""

from refinery.eval.arith import load_arith
from refinery.eval.datasets import (
    DATASETS,
    load_dataset,
    load_gsm8k,
    load_humaneval,
    load_jsonl,
    load_math500,
    parse_fields,
)
from refinery.eval.example import DatasetError, Example, dataset_fingerprint
from refinery.eval.guarded import StrategyCrash
from refinery.eval.metrics import (
    Accuracy,
    CostSummary,
    Score,
    Scorer,
    accuracy,
    cost_summary,
    gsm8k_flexible_match,
    gsm8k_strict_match,
    mean_pass_at_k,
    pass_at_k,
    wilson_interval,
)
from refinery.eval.ray_pool import RayOptions
from refinery.eval.report import ReportFiles, RunReport, load_run, pareto_front, write_report
from refinery.eval.results_file import read_results
from refinery.eval.run_dir import ConfigMismatchError
from refinery.eval.runner import EvalConfig, RunAborted, RunSummary, run_eval

__all__ = [
    "DATASETS",
    "Accuracy",
    "ConfigMismatchError",
    "CostSummary",
    "DatasetError",
    "EvalConfig",
    "Example",
    "ReportFiles",
    "RayOptions",
    "RunAborted",
    "RunReport",
    "RunSummary",
    "Score",
    "Scorer",
    "StrategyCrash",
    "accuracy",
    "cost_summary",
    "dataset_fingerprint",
    "gsm8k_flexible_match",
    "gsm8k_strict_match",
    "load_arith",
    "load_dataset",
    "load_gsm8k",
    "load_humaneval",
    "load_jsonl",
    "load_math500",
    "load_run",
    "mean_pass_at_k",
    "parse_fields",
    "pareto_front",
    "pass_at_k",
    "read_results",
    "run_eval",
    "wilson_interval",
    "write_report",
]
