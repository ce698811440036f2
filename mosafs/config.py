"""The configuration file (TOML) of the daemons, and the environment variables that
override it (docs/operations.md).

    mosafs --config /etc/mosafs/mosafs.toml manager      (or $MOSAFS_CONFIG)

A section per daemon: [manager], [benefactor], [mount], [up]. Its keys are the command's
long options without the dashes (`gc-grace` or `gc_grace`), with TOML values: strings,
numbers, booleans (a flag such as `insecure = true`), arrays for repeatable options.
Every key can also come from the environment as MOSAFS_<SECTION>_<KEY> (upper case, `_`
for `-`): MOSAFS_MANAGER_GC_GRACE=30. Precedence: a flag on the command line, then the
environment, then the file, then the built-in default. Every value is checked as the flag
would be; an unknown section or key, or a bad value, is a one-line error that names it.

One section, [admin], serves every administrative command (status, pool, policy,
benefactor list, ...): how to reach the cluster, ADMIN_KEYS, the options those commands
share (`mosafs.admin.common.add_manager_arguments`). The variables those commands read
already ($MOSAFS_MANAGER, $MOSAFS_TLS_DIR, $MOSAFS_INSECURE) outrank the file's keys, as
the environment does everywhere.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError

DAEMONS = ("manager", "benefactor", "mount", "up")
ADMIN = "admin"
SECTIONS = (*DAEMONS, ADMIN)
ENV_PREFIX = "MOSAFS_"
ADMIN_KEYS = ("manager", "data-dir", "tls-dir", "tls-name", "insecure")
# The admin commands' own variables: set, they win over the file's key.
ADMIN_ENV = {"manager": "MOSAFS_MANAGER", "tls-dir": "MOSAFS_TLS_DIR",
             "insecure": "MOSAFS_INSECURE"}


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
    """Set the defaults of PARSER (the parser of COMMAND) from the file and the environment:
    [COMMAND] for a daemon, [admin] for the administrative actions and commands. The
    values set (for tests and logs)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    sections = load_file(file) if file is not None else {}
    chosen: dict[str, Any] = {}
    if command in DAEMONS:
        chosen.update(_apply_daemon(parser, command, sections.get(command, {}), file, env))
    # `mosafs benefactor` is a daemon and has admin actions (list, drain, ...): [admin] is
    # for the actions only.
    admin = _subparsers(parser) if command in DAEMONS else [parser, *_subparsers(parser)]
    if admin:
        chosen.update(_apply_admin(admin, sections.get(ADMIN, {}), file, env))
    return chosen


def _apply_daemon(parser: argparse.ArgumentParser, command: str, body: dict[str, Any],
                  file: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
    options = _options(parser)
    chosen: dict[str, Any] = {}
    for key, raw in body.items():
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


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below PARSER (the actions of `mosafs pool`, ...)."""
    out = []
    for action in parser._actions:  # argparse keeps no public list of subparsers either
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += [sub, *_subparsers(sub)]
    return out


def _apply_admin(parsers: list[argparse.ArgumentParser], body: dict[str, Any],
                 file: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
    """[admin] and MOSAFS_ADMIN_<KEY>, set on each of PARSERS that has the option (`mosafs
    certs` has none of them, and takes none)."""
    keys = ", ".join(ADMIN_KEYS)
    raw: dict[str, tuple[Any, str]] = {}  # key -> (value, where it comes from)
    for key, value in body.items():
        name = key.replace("_", "-")
        where = f"config file {file}: [{ADMIN}] {key}"
        if name not in ADMIN_KEYS:
            raise ConfigError(f"{where}: unknown key (keys: {keys})")
        if ADMIN_ENV.get(name, "") not in env:
            raw[name] = (value, where)
    prefix = f"{ENV_PREFIX}{ADMIN.upper()}_"
    for variable, value in env.items():
        if variable.startswith(prefix):
            name = variable[len(prefix):].lower().replace("_", "-")
            if name not in ADMIN_KEYS:
                raise ConfigError(f"{variable}: no key {name} of [{ADMIN}] (keys: {keys})")
            raw[name] = (value, variable)
    chosen: dict[str, Any] = {}
    for parser in parsers:
        options = _options(parser)
        values = {options[name].dest: _value(options[name], value, where)
                  for name, (value, where) in raw.items() if name in options}
        parser.set_defaults(**values)
        chosen.update(values)
    return chosen
