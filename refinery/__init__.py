"""refinery: inference-time reasoning and refinement over a batched vLLM backend.

The face of the project: re-exports the public API of the packages below it.
"""

from refinery.engine.backends.base import Backend
from refinery.engine.context import Budget, Context
from refinery.engine.errors import RefineryError
from refinery.engine.run import run, solve_one
from refinery.engine.trace import Trace, TraceWriter, read_traces
from refinery.engine.types import Attempt, Completion, Message, SamplingParams, Task, Usage

__all__ = [
    "Attempt", "Backend", "Budget", "Completion", "Context", "Message", "RefineryError",
    "SamplingParams", "Task", "Trace", "TraceWriter", "Usage", "read_traces", "run",
    "solve_one",
]
__version__ = "0.1.0"
