"""The dtype a CPU computes fastest, read from the CPU the engine runs on.

vLLM's ``dtype="auto"`` takes the checkpoint's dtype. On a CPU without native
bfloat16 arithmetic (AVX2 only, or AVX-512 without its BF16 extension) vLLM
then emulates bf16 and the embedded 135M model ran at a quarter of its
float32 speed (38.7 vs 155.0 tok/s on a 2-core AVX2 EPYC). So on CPU the
engine picks the dtype itself: bfloat16 only where the CPU has it natively,
float32 everywhere else. On a GPU vLLM's own ``auto`` stays.

What counts as native is what vLLM's CPU build keys its kernels on: on x86 it
loads its bf16 kernel library only with ``avx512_bf16`` (AMX tiles, ``amx_bf16``,
come with it on the CPUs that have them); on Arm the ``bf16`` feature
(FEAT_BF16).

Example:
    >>> choice = cpu_dtype(CpuInfo(machine="x86_64", flags=frozenset({"avx2", "fma"})))
    >>> choice.dtype, choice.reason
    ('float32', 'no native bf16 on this CPU (x86_64 without avx512_bf16 or amx_bf16)')
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from refinery.engine.errors import InvalidRequestError

DTYPES = ("auto", "bfloat16", "float16", "float32")  # what --dtype and VLLMConfig take
X86_BF16 = ("avx512_bf16", "amx_bf16")
ARM_BF16 = ("bf16",)


@dataclass(frozen=True)
class CpuInfo:
    """What decides the dtype: the architecture and the CPU's feature flags."""

    machine: str  # platform.machine(): x86_64, aarch64, ...
    flags: frozenset[str]
    model: str = ""

    @classmethod
    def read(cls, cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
        """This machine's CPU; no flags where ``/proc/cpuinfo`` is unreadable (not Linux)."""
        flags: set[str] = set()
        model = ""
        try:
            text = cpuinfo.read_text(errors="replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("flags", "features") and not flags:  # x86 "flags", Arm "Features"
                flags = set(value.split())
            elif key == "model name" and not model:
                model = value.strip()
        return cls(machine=platform.machine().lower(), flags=frozenset(flags), model=model)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the engine will run and why, for the one log line at start."""

    dtype: str
    reason: str

    def log_line(self) -> str:
        return f"engine dtype {self.dtype}: {self.reason}"


def cpu_dtype(cpu: CpuInfo) -> DtypeChoice:
    """bfloat16 where ``cpu`` computes it natively, float32 otherwise."""
    native = X86_BF16 if cpu.machine in ("x86_64", "amd64", "i686") else ARM_BF16
    have = [f for f in native if f in cpu.flags]
    if have:
        return DtypeChoice("bfloat16", f"native bf16 on this CPU ({', '.join(have)})")
    return DtypeChoice("float32", f"no native bf16 on this CPU ({cpu.machine} without "
                                  f"{' or '.join(native)})")


def choose_dtype(requested: str, is_cpu: bool, cpu: CpuInfo | None = None) -> DtypeChoice:
    """The dtype to give vLLM: ``requested`` unless it is ``auto`` on a CPU.

    Args:
        requested: ``auto`` or an explicit dtype (``--dtype``, ``VLLMConfig.dtype``).
        is_cpu: whether vLLM runs on the CPU platform.
        cpu: the CPU to decide for (default: read this machine's).

    Raises:
        InvalidRequestError: ``requested`` is none of :data:`DTYPES`.
    """
    if requested not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {requested!r}; use one of "
                                  f"{', '.join(DTYPES)}", param="dtype")
    if requested != "auto":
        return DtypeChoice(requested, "asked for explicitly")
    if not is_cpu:
        return DtypeChoice("auto", "vLLM's auto on an accelerator (the checkpoint's dtype)")
    return cpu_dtype(cpu or CpuInfo.read())
