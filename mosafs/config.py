"""The configuration file (TOML) of the daemons, and the environment variables that
override it (docs/operations.md).

    mosafs --config /etc/mosafs/mosafs.toml manager      (or $MOSAFS_CONFIG)

A section per command: [manager], [benefactor], [mount], [up]. Its keys are the command's
long options without the dashes (`gc-grace` or `gc_grace`), with TOML values: strings,
numbers, booleans (a flag such as `insecure = true`), arrays for repeatable options.
Every key can also come from the environment as MOSAFS_<SECTION>_<KEY> (upper case, `_`
for `-`): MOSAFS_MANAGER_GC_GRACE=30. Precedence: a flag on the command line, then the
environment, then the file, then the built-in default. Every value is checked as the flag
would be; an unknown section or key, or a bad value, is a one-line error that names it.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError

SECTIONS = ("manager", "benefactor", "mount", "up")
ENV_PREFIX = "MOSAFS_"


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """key -> action of PARSER's long options (help and the config option excluded)."""
    out = {}
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "config") or action.help == argparse.SUPPRESS:
            continue
        out[longs[0][2:].replace("_", "-")] = action
    return out


def _value(action: argparse.Action, raw: Any, where: str) -> Any:
    """RAW (from TOML or the environment) as the flag of ACTION would give it."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if isinstance(raw, str):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ConfigError(f"{where}: not a boolean: {raw!r} (use true or false)")
            raw = raw.lower() in ("1", "true", "yes")
        if not isinstance(raw, bool):
            raise ConfigError(f"{where}: not a boolean: {raw!r} (use true or false)")
        return raw if isinstance(action, argparse._StoreTrueAction) else not raw
    if isinstance(action, argparse._AppendAction):
        items = raw if isinstance(raw, list) else str(raw).split(",")
        return [_scalar(action, item, where) for item in items]
    if isinstance(raw, list | dict):
        raise ConfigError(f"{where}: takes one value, not {type(raw).__name__}")
    return _scalar(action, raw, where)


def _scalar(action: argparse.Action, raw: Any, where: str) -> Any:
    text = str(raw).lower() if isinstance(raw, bool) else str(raw)
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc or 'bad value'}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{where}: must be one of {', '.join(map(str, action.choices))}, "
                          f"got {raw!r}")
    return value


def load_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section, body in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"config file {path}: unknown section [{section}]; sections: "
                              + ", ".join(f"[{s}]" for s in SECTIONS))
        if not isinstance(body, dict):
            raise ConfigError(f"config file {path}: [{section}] must be a table of keys")
    return data


def apply(parser: argparse.ArgumentParser, command: str, file: Path | None,
          environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Set PARSER's defaults from the file's [COMMAND] and the environment; the values set
    (for tests and logs)."""
    if command not in SECTIONS:
        return {}
    env: Mapping[str, str] = os.environ if environ is None else environ
    options = _options(parser)
    chosen: dict[str, Any] = {}
    if file is not None:
        for key, raw in load_file(file).get(command, {}).items():
            name = key.replace("_", "-")
            action = options.get(name)
            where = f"config file {file}: [{command}] {key}"
            if action is None:
                raise ConfigError(f"{where}: unknown key (`mosafs {command} --help` lists them)")
            chosen[action.dest] = _value(action, raw, where)
    prefix = f"{ENV_PREFIX}{command.upper()}_"
    for variable, raw in env.items():
        if not variable.startswith(prefix):
            continue
        name = variable[len(prefix):].lower().replace("_", "-")
        action = options.get(name)
        if action is None:
            raise ConfigError(f"{variable}: no option --{name} of `mosafs {command}`")
        chosen[action.dest] = _value(action, raw, variable)
    parser.set_defaults(**chosen)
    return chosen
