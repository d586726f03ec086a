"""Parity: every config field is a flag of the same name, bounds, choices and default,
and no flag of a config's command lacks a field (but the few each command owns).

The expected flag of a field is computed here from the field itself, apart from
``refinery.cli.flags``: a hand-written flag that shadows a field, or a slip in
the derivation, fails here.
"""

from __future__ import annotations

import typing

import annotated_types as at
import click
import pytest
from pydantic import BaseModel

from refinery.cli import app
from refinery.cli.flags import fields_of
from refinery.distill import LoopConfig, TrainConfig
from refinery.eval import EvalConfig
from refinery.eval.tune import TuneConfig
from refinery.serving import ServerConfig

# Should a flag ever let a run start, it fails fast against a closed port, no engine.
DEAD_UPSTREAM = ["--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"]

# command path -> (its config, fields it builds from flags of its own, its own flags)
PARITY = {
    ("eval", "run"): (EvalConfig, set(), {"force", "retry_errors", "progress"}),
    ("distill", "loop"): (LoopConfig, set(), {"progress"}),
    ("distill", "train"): (TrainConfig, set(), set()),
    ("tune",): (TuneConfig, set(), {"progress"}),
    ("serve",): (ServerConfig, {"presets", "effort", "api_keys", "allowed_hosts", "profiles"},
                 {"host", "port", "backend", "base_url", "dtype", "upstream_api_key",
                  "api_key_file", "effort", "compile_graph", "runs", "hosts", "profiles",
                  "reasoning_parser", "tool_call_parser"}),
}


def command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = app
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def all_commands(group: click.Group = app, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from all_commands(command, (*path, name))


def expected_flags(config: type, prefix: str = "") -> dict[str, tuple]:
    """name -> (flag, default, bounds or choices) for every field, nested ones flattened."""
    out = {}
    for name, field in fields_of(config).items():
        kind = field.annotation
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) in (typing.Union, __import__("types").UnionType):
            kind = args[0]
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out[prefix + name] = (f"--{prefix + name}".replace("_", "-"), False, None)
            out |= expected_flags(kind, f"{prefix}{name}_")
            continue
        default = "required" if field.is_required() else field.get_default(
            call_default_factory=True)
        if default is None and typing.get_origin(kind) is list:
            default = []  # a repeated flag given no times: the field's None
        if isinstance(default, dict):
            default = [f"{k}={v}" for k, v in default.items()]
        elif isinstance(default, list | tuple | set | frozenset):
            default = list(default)
        limits = {}
        for m in field.metadata:
            for attr, key, is_open in (("ge", "min", False), ("gt", "min", True),
                                       ("le", "max", False), ("lt", "max", True)):
                if isinstance(m, getattr(at, attr.capitalize())):
                    limits[key] = (getattr(m, attr), is_open)
        choices = list(typing.get_args(kind)) if typing.get_origin(kind) is typing.Literal \
            else None
        out[prefix + name] = (f"--{prefix + name}".replace("_", "-"), default,
                              choices if choices is not None else limits)
    return out


def actual_flag(option: click.Option) -> tuple:
    default = option.default() if callable(option.default) else option.default
    if option.required:
        default = "required"
    elif option.multiple:
        default = list(default or ())
    t = option.type
    if isinstance(t, click.Choice):
        limits = list(t.choices)
    elif isinstance(t, click.IntRange | click.FloatRange):
        limits = {k: (getattr(t, k), getattr(t, f"{k}_open")) for k in ("min", "max")
                  if getattr(t, k) is not None}
    else:
        limits = {}
    return option.opts[0], default, limits


@pytest.mark.parametrize("path", PARITY, ids=" ".join)
def test_every_field_is_a_flag_of_its_name_bounds_and_default(path) -> None:
    config, built, own = PARITY[path]
    options = {p.name: p for p in command_at(path).params if isinstance(p, click.Option)}
    expected = {k: v for k, v in expected_flags(config).items() if k not in built}
    for name, (flag, default, limits) in expected.items():
        assert name in options, f"{config.__name__}.{name} has no flag"
        got = actual_flag(options[name])
        if default is False and limits is None:  # a nested config's switch
            assert got[:2] == (flag, False), name
            continue
        assert got == (flag, default, limits), f"{name}: flag {got}, field says "\
            f"{(flag, default, limits)}"
    assert set(options) - set(expected) - {"help"} == own  # no flag lacks a field


def test_every_command_built_from_a_config_is_checked() -> None:
    with_config = {path for path, c in all_commands() if hasattr(c.callback, "config_flags")}
    assert with_config == set(PARITY)


@pytest.mark.parametrize("path", [("eval", "run"), ("distill", "loop")], ids=" ".join)
def test_a_ray_flag_without_ray_is_refused_alike(path, tmp_path) -> None:
    from click.testing import CliRunner

    argv = [*path, "--ray-replicas", "2", "--out", str(tmp_path / "r")]
    if path == ("eval", "run"):
        argv += ["--dataset", "arith", "--strategy", "cot", *DEAD_UPSTREAM]
    result = CliRunner().invoke(app, argv)
    assert (result.exit_code, result.output) == (2, "error: --ray-replicas needs --ray\n")


def test_a_value_the_config_refuses_is_one_line_naming_the_flag(tmp_path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(app, ["eval", "run", "--dataset", "arith", "--strategy", "cot",
                                      "--out", str(tmp_path / "r"), "--top-p", "0",
                                      *DEAD_UPSTREAM])
    assert result.exit_code == 2
    assert result.output == ("error: Invalid value for '--top-p': 0.0 is not in the range "
                             "0.0<x<=1.0. (see 'refinery eval run --help')\n")
