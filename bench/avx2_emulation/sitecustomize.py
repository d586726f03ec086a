"""Run the engine as it runs on an AVX2-only x86 CPU, on a CPU that has AVX-512.

Put this folder first on ``PYTHONPATH`` and every Python process started with
that environment (the bench, vLLM's engine core, an upstream server) imports
it at start-up:

    PYTHONPATH=bench/avx2_emulation python bench/cpu_dtype.py

What an AVX2-only CPU changes for this stack, and how each is masked here:

* the math libraries' kernels: ATen's vectorised ops (``ATEN_CPU_CAPABILITY``),
  oneDNN (``ONEDNN_MAX_CPU_ISA``) and MKL (``MKL_ENABLE_INSTRUCTIONS``) are
  capped at AVX2 by their own switches;
* vLLM's kernel library and kernel choices, keyed on
  ``torch.cpu.get_capabilities()``: the AVX-512 and AMX entries read false, so
  vLLM loads ``_C_AVX2`` as it does on such a CPU;
* refinery's dtype choice (``refinery.engine.hardware.CpuInfo.read``): the
  AVX-512 and AMX flags are dropped from what it reads.

What it cannot change: the silicon. Clocks, caches, memory bandwidth and how
fast the core runs AVX2 code stay the host's; anything that reads CPUID
itself (torch's bf16 device checks, for one) still sees AVX-512. Figures from
it are "this CPU, AVX2 code paths", never a stand-in for a named AVX2 CPU.
This is a bench tool: nothing in the package imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
for _name, _value in CAPS.items():
    os.environ.setdefault(_name, _value)


def _masked(name: str) -> bool:
    return name.startswith(("avx512", "amx"))


def _patch_torch_cpu(module) -> None:
    real = module.get_capabilities

    def get_capabilities():
        from types import MappingProxyType

        caps = dict(real())
        return MappingProxyType({k: (False if _masked(k) else v) for k, v in caps.items()})

    module.get_capabilities = get_capabilities


def _patch_hardware(module) -> None:
    cpu_info = module.CpuInfo
    real = cpu_info.read.__func__

    def read(cls, *args, **kwargs):
        cpu = real(cls, *args, **kwargs)
        return cls(machine=cpu.machine, model=cpu.model,
                   flags=frozenset(f for f in cpu.flags if not _masked(f)))

    cpu_info.read = classmethod(read)


PATCHES = {"torch.cpu": _patch_torch_cpu, "refinery.engine.hardware": _patch_hardware}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a patched module."""

    def find_spec(self, fullname, path, target=None):
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchAfterImport())
