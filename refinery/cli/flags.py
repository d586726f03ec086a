"""A command's flags derived from its config: each field's name, type, bounds and default.

A command that builds a config (``EvalConfig``, ``LoopConfig``, ``TrainConfig``,
``ServerConfig``) does not spell its flags: :func:`config_flags` makes one per
field, so a flag cannot drift from the field it fills, and a field someone adds
to the config appears on the command line by itself. The rules:

- ``top_p: float = Field(1.0, gt=0.0, le=1.0)`` is ``--top-p FLOAT RANGE [0<x<=1]``,
  default 1.0; a ``Literal`` is a choice, a ``bool`` ``--x/--no-x``, a list a
  repeated flag, a ``dict`` a repeated ``KEY=VALUE``;
- ``ray: RayOptions | None`` (an optional nested config) is a ``--ray`` switch and
  the nested fields under its prefix (``--ray-replicas``); a ``--ray-*`` flag
  without ``--ray`` is refused, in every command alike;
- the config validates what the flags give it, and a refusal is one line naming
  the flag (``error: --top-p: Input should be greater than 0``).

Example:
    >>> from pydantic import BaseModel, Field
    >>> class Sampling(BaseModel):
    ...     top_p: float = Field(1.0, gt=0.0, le=1.0)
    >>> [(o.opts, o.default, o.type.min_open) for o in ConfigFlags(Sampling).options()]
    [(['--top-p'], 1.0, True)]
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Union

import annotated_types as at
import click
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from refinery.cli.console import USAGE, bad_option, fail, flag_name

__all__ = ["ConfigFlags", "config_flags", "fields_of"]

_SEQUENCES = (list, tuple, set, frozenset)


def fields_of(config: type) -> dict[str, FieldInfo]:
    """The fields of a pydantic model or a dataclass, as pydantic describes them."""
    if issubclass(config, BaseModel):
        return dict(config.model_fields)
    hints = typing.get_type_hints(config, include_extras=True)
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = FieldInfo.from_annotated_attribute(hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = FieldInfo.from_annotated_attribute(
                hints[f.name], Field(default_factory=f.default_factory))
        else:
            out[f.name] = FieldInfo.from_annotation(hints[f.name])
    return out


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _nested(field: FieldInfo) -> type[BaseModel] | None:
    inner = _strip_optional(field.annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _range(kind: type, field: FieldInfo) -> click.ParamType:
    bound: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, at.Ge | at.Gt):
            bound |= {"min": m.ge if isinstance(m, at.Ge) else m.gt,
                      "min_open": isinstance(m, at.Gt)}
        if isinstance(m, at.Le | at.Lt):
            bound |= {"max": m.le if isinstance(m, at.Le) else m.lt,
                      "max_open": isinstance(m, at.Lt)}
    if kind is int:
        return click.IntRange(**bound) if bound else click.INT
    return click.FloatRange(**bound) if bound else click.FLOAT


def _leaf_type(kind: Any, field: FieldInfo) -> click.ParamType | None:
    if typing.get_origin(kind) is Literal:
        return click.Choice([str(v) for v in typing.get_args(kind)])
    if kind in (int, float):
        return _range(kind, field)
    if kind is str:
        return click.STRING
    if kind is Path:
        return click.Path(path_type=Path)
    return None


def _option(name: str, flag: str, field: FieldInfo, help_: str | None) -> click.Option | None:
    """The flag of one field, or None for a type the command line cannot spell."""
    args = _option_args(name, flag, field, help_)
    return None if args is None else click.Option(args[0], **args[1])


def _option_args(name: str, flag: str, field: FieldInfo,
                 help_: str | None) -> tuple[list[str], dict[str, Any]] | None:
    kind = _strip_optional(field.annotation)
    origin = typing.get_origin(kind)
    # A factory's default is the config's at parse time (a path under $REFINERY_HOME).
    default = field.default_factory if field.default_factory else field.default
    required = default is PydanticUndefined
    common: dict[str, Any] = {"help": help_ or field.description, "required": required,
                              "show_default": not required and not field.default_factory}
    if kind is bool:
        return [name, f"{flag}/--no-{flag[2:]}"], {"default": default, **common}
    if origin is dict:
        items = field.get_default(call_default_factory=True) or {}
        return [name, flag], {"multiple": True, "metavar": "KEY=VALUE", **common,
                              "default": [f"{k}={v}" for k, v in items.items()]}
    if origin in _SEQUENCES:
        leaf = _leaf_type(typing.get_args(kind)[0], field)
        return None if leaf is None else ([name, flag], {
            "type": leaf, "multiple": True, **common,
            "default": list(field.get_default(call_default_factory=True) or ())})
    leaf = _leaf_type(kind, field)
    if leaf is None:
        return None
    return [name, flag], {"type": leaf, **({} if required else {"default": default}), **common}


def _key_values(flag: str, items: tuple[str, ...], any_value: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"{flag}: expected KEY=VALUE, got {item!r}", USAGE)
        out[key.strip()] = _json_or_text(value.strip()) if any_value else value.strip()
    return out


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


@dataclasses.dataclass(frozen=True)
class ConfigFlags:
    """The flags of ``config``'s fields, and the config they build.

    ``leave_out``: fields the command fills itself (or leaves at their default);
    ``help``: help for fields whose config gives no description (help only: the
    name, type, bounds and default are always the field's).
    """

    config: type
    leave_out: frozenset[str] = frozenset()
    help: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def _fields(self) -> dict[str, FieldInfo]:
        return {n: f for n, f in fields_of(self.config).items() if n not in self.leave_out}

    def options(self) -> list[click.Option]:
        """One option per field (a switch and the nested ones for a nested config)."""
        out = []
        for name, field in self._fields().items():
            nested = _nested(field)
            if nested is None:
                out.append(_option(name, flag_name([name]), field, self.help.get(name)))
                continue
            out.append(click.Option([name, flag_name([name])], is_flag=True, default=False,
                                    help=self.help.get(name) or field.description))
            out += [_option(f"{name}_{sub}", flag_name([name, sub]), f,
                            self.help.get(f"{name}_{sub}"))
                    for sub, f in fields_of(nested).items()]
        return [o for o in out if o is not None]

    def build(self, values: dict[str, Any]) -> Any:
        """The config from a command's ``values`` (its fields' flags are taken out)."""
        data = {}
        for name, field in self._fields().items():
            nested = _nested(field)
            if nested is None:
                if name in values:
                    data[name] = self._value(name, field, values.pop(name))
                continue
            subs = {sub: self._value(f"{name}_{sub}", f, values.pop(f"{name}_{sub}"))
                    for sub, f in fields_of(nested).items() if f"{name}_{sub}" in values}
            data[name] = subs if values.pop(name) else self._switched_off(name, nested, subs)
        try:
            return TypeAdapter(self.config).validate_python(data)
        except ValidationError as exc:
            bad_option(exc)

    @staticmethod
    def _value(name: str, field: FieldInfo, value: Any) -> Any:
        origin = typing.get_origin(_strip_optional(field.annotation))
        if origin is dict:
            any_value = typing.get_args(_strip_optional(field.annotation))[1] is Any
            return _key_values(flag_name([name]), value, any_value)
        if origin in _SEQUENCES:
            default = field.get_default(call_default_factory=True)
            return list(value) if value or default is not None else None
        return value

    @staticmethod
    def _switched_off(name: str, nested: type, subs: dict[str, Any]) -> None:
        for sub, f in fields_of(nested).items():
            if sub in subs and subs[sub] != f.get_default(call_default_factory=True):
                fail(f"{flag_name([name, sub])} needs {flag_name([name])}", USAGE)
        return None


def config_flags(config: type, *, leave_out: tuple[str, ...] = (),
                 help: Mapping[str, str] | None = None) -> Callable[[Callable], Callable]:
    """Give a click command ``config``'s flags; it receives the built config first.

    Example:
        >>> @click.command()
        ... @config_flags(EvalConfig, leave_out=("out",))
        ... @click.option("--force", is_flag=True)
        ... def run(config: EvalConfig, force: bool) -> None: ...  # doctest: +SKIP
    """
    flags = ConfigFlags(config, frozenset(leave_out), dict(help or {}))

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def with_config(**values: Any) -> Any:
            return command(flags.build(values), **values)

        own = list(getattr(command, "__click_params__", []))
        with_config.__click_params__ = [*own, *reversed(flags.options())]  # type: ignore[attr-defined]
        with_config.config_flags = flags  # type: ignore[attr-defined]
        return with_config

    return decorate


def field_option(config: type, name: str, *, default: Any = PydanticUndefined,
                 help: str | None = None) -> Callable[[Callable], Callable]:
    """One field's flag for a command that builds no ``config`` itself, with its own default.

    ``solve`` takes ``--temperature`` as ``SamplingParams`` bounds it, greedy by default.
    """
    field = fields_of(config)[name]
    if default is not PydanticUndefined:
        field = copy.copy(field)
        field.default, field.default_factory = default, None
    args = _option_args(name, flag_name([name]), field, help)
    assert args is not None, f"{config.__name__}.{name} has no flag form"
    return click.option(*args[0], **args[1])
