"""The engine's dtype follows the CPU: bf16 only where it is native."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from refinery.engine.errors import InvalidRequestError
from refinery.engine.hardware import CpuInfo, choose_dtype, cpu_dtype

# Flag lines as /proc/cpuinfo prints them (trimmed), one per kind of machine met.
EPYC_AVX2 = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 sha_ni"
SKYLAKE_AVX512 = EPYC_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
SAPPHIRE_RAPIDS = SKYLAKE_AVX512 + " avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16"
ZEN4 = SKYLAKE_AVX512 + " avx512_bf16 avx512_vbmi2"
GRAVITON2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp"
GRAVITON3 = GRAVITON2 + " sve i8mm bf16 svebf16"


def cpu(flags: str, machine: str = "x86_64") -> CpuInfo:
    return CpuInfo(machine=machine, flags=frozenset(flags.split()))


@pytest.mark.parametrize(("flags", "machine", "dtype"), [
    (EPYC_AVX2, "x86_64", "float32"),
    (SKYLAKE_AVX512, "x86_64", "float32"),  # AVX-512 without its BF16 extension
    (SAPPHIRE_RAPIDS, "x86_64", "bfloat16"),
    (ZEN4, "x86_64", "bfloat16"),
    (GRAVITON2, "aarch64", "float32"),
    (GRAVITON3, "aarch64", "bfloat16"),
    ("", "x86_64", "float32"),  # unreadable /proc/cpuinfo: the safe choice
])
def test_auto_picks_bf16_only_where_the_cpu_has_it_natively(flags, machine, dtype) -> None:
    choice = choose_dtype("auto", is_cpu=True, cpu=cpu(flags, machine))
    assert choice.dtype == dtype
    assert choice.log_line().startswith(f"engine dtype {dtype}: ")


def test_reason_names_the_flags_that_decided() -> None:
    assert cpu_dtype(cpu(SAPPHIRE_RAPIDS)).reason == \
        "native bf16 on this CPU (avx512_bf16, amx_bf16)"
    assert cpu_dtype(cpu(EPYC_AVX2)).reason == \
        "no native bf16 on this CPU (x86_64 without avx512_bf16 or amx_bf16)"
    assert cpu_dtype(cpu(GRAVITON2, "aarch64")).reason == \
        "no native bf16 on this CPU (aarch64 without bf16)"


def test_an_unknown_dtype_is_refused_before_the_engine_starts() -> None:
    with pytest.raises(InvalidRequestError, match="unknown dtype 'fp8'; use one of auto"):
        choose_dtype("fp8", is_cpu=True, cpu=cpu(EPYC_AVX2))


def test_an_explicit_dtype_and_an_accelerator_are_left_alone() -> None:
    assert choose_dtype("bfloat16", is_cpu=True, cpu=cpu(EPYC_AVX2)).dtype == "bfloat16"
    assert choose_dtype("float32", is_cpu=True, cpu=cpu(SAPPHIRE_RAPIDS)).dtype == "float32"
    assert choose_dtype("auto", is_cpu=False, cpu=cpu(EPYC_AVX2)).dtype == "auto"


def test_cpuinfo_is_read_from_the_x86_and_the_arm_layout(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"
                   f"flags\t\t: {EPYC_AVX2}\n\nprocessor\t: 1\nflags\t\t: {EPYC_AVX2}\n")
    info = CpuInfo.read(x86)
    assert info.model == "AMD EPYC 7B13"
    assert "avx2" in info.flags and "avx512_bf16" not in info.flags
    arm = tmp_path / "arm"
    arm.write_text(f"processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: {GRAVITON3}\n")
    assert {"bf16", "sve"} <= CpuInfo.read(arm).flags
    assert CpuInfo.read(tmp_path / "missing").flags == frozenset()


def test_this_machine_gets_what_its_flags_say() -> None:
    here = CpuInfo.read()
    native = {"avx512_bf16", "amx_bf16", "bf16"} & here.flags
    assert choose_dtype("auto", is_cpu=True).dtype == ("bfloat16" if native else "float32")


def test_the_avx2_emulation_masks_every_view_the_engine_reads(tmp_path: Path) -> None:
    """``bench/avx2_emulation`` (AVX2 code paths on an AVX-512 host) hides AVX-512 and
    AMX from vLLM's kernel choice and our dtype choice and caps the math libraries."""
    if CpuInfo.read().machine not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 emulation is for x86 hosts")
    shim = Path(__file__).resolve().parents[2] / "bench" / "avx2_emulation"
    probe = ("import json, os, torch\n"
             "from refinery.engine.hardware import CpuInfo, choose_dtype\n"
             "caps = torch.cpu.get_capabilities()\n"
             "print(json.dumps({'avx512': sorted(k for k, v in caps.items() if v and "
             "k.startswith(('avx512', 'amx'))), 'avx2': torch.cpu._is_avx2_supported(),\n"
             " 'aten': torch.backends.cpu.get_cpu_capability(),\n"
             " 'onednn': os.environ['ONEDNN_MAX_CPU_ISA'],\n"
             " 'flags': sorted(f for f in CpuInfo.read().flags if 'avx512' in f),\n"
             " 'dtype': choose_dtype('auto', is_cpu=True).dtype}))\n")
    env = {**os.environ, "PYTHONPATH": str(shim)}
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True, timeout=120)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["avx512"] == [] and seen["flags"] == []
    assert seen["onednn"] == "AVX2" and seen["dtype"] == "float32"
    if "avx2" in CpuInfo.read().flags:
        assert seen["avx2"] is True and seen["aten"] == "AVX2"
