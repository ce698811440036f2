"""Series patterns (DESIGN §3): which files of a folder are steps of one checkpoint series.

A pattern is a template of literal text and `{placeholders}`, parsed with the standard
library's `string.Formatter` (so `{{` and `}}` stand for literal braces). `{step}` must
appear exactly once and matches a decimal integer; every other placeholder (`{app}`,
`{node}`, any name) matches one or more characters and the values of all of them together
are the series key. The default, stdchk's convention, is `{app}.{node}.{step}`:
`app.n0.12` is step 12 of series (app, n0). Matching is a full match of the whole name.
Placeholders other than `{step}` match as few characters as they can, so a name matches
one way only (`my.app.n0.3`: app "my", node "app.n0").
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import lru_cache

from mosafs.errors import ConfigError

DEFAULT_PATTERN = "{app}.{node}.{step}"
MAX_PATTERN = 256
STEP = "step"
_PLACEHOLDER = re.compile(r"[a-z_][a-z0-9_]{0,31}")
_MAX_STEP_DIGITS = 19  # a step fits an unsigned 64-bit integer
# Placeholders besides {step}: each more multiplies the worst match's time (a 255-byte
# name of dots: 40 ms with 3, 2.4 s with 4), and pruning matches every name of a folder.
MAX_KEYS = 3


@dataclass(frozen=True)
class SeriesName:
    """A name that matched a pattern: its series key and step."""

    key: tuple[str, ...]
    step: int


@dataclass(frozen=True)
class Pattern:
    template: str
    regex: re.Pattern[str]
    keys: tuple[str, ...]

    def match(self, name: str) -> SeriesName | None:
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        return SeriesName(tuple(m.group(k) for k in self.keys), int(m.group(STEP)))


def check_pattern(template: str) -> str:
    """TEMPLATE, if it may be set (ConfigError otherwise): a valid pattern whose matching
    stays fast (a literal between placeholders, at most MAX_KEYS of them)."""
    compile_pattern(template, new=True)
    return template


@lru_cache(maxsize=256)
def compile_pattern(template: str, *, new: bool = False) -> Pattern:
    """The Pattern of TEMPLATE; ConfigError says what is wrong with a bad one. NEW: a
    pattern being set, held to the limits on its matching time too; a stored one (set
    before those limits) is used as it is, so that its folder's writes go on."""
    if not template or len(template) > MAX_PATTERN:
        raise ConfigError(f"a series pattern has 1..{MAX_PATTERN} characters, got "
                          f"{len(template)}")
    if "/" in template or "\0" in template:
        raise ConfigError(f"series pattern {template!r}: names contain no '/' or NUL")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"series pattern {template!r}: {exc} (write {{{{ and }}}} for "
                          f"literal braces)") from None
    regex = []
    keys: list[str] = []
    steps = 0
    after_key = False  # the part before this one ended with a placeholder other than step
    for literal, field, spec, conversion in parts:
        regex.append(re.escape(literal))
        if field is None:
            continue
        if new and after_key and not literal and field != STEP:
            # Two placeholders with nothing between them: no name says where one ends,
            # and matching them backtracks in time polynomial in the name's length
            # (pruning matches every name of a folder in a write transaction).
            raise ConfigError(f"series pattern {template!r}: put a literal between "
                              f"placeholders (like {{app}}.n{{node}}.{{step}})")
        after_key = field != STEP
        if spec or conversion or not _PLACEHOLDER.fullmatch(field):
            raise ConfigError(f"series pattern {template!r}: bad placeholder {{{field}}}: use "
                              f"{{step}} and names like {{app}} (a-z, 0-9, _)")
        if field == STEP:
            steps += 1
            regex.append(f"(?P<{STEP}>[0-9]{{1,{_MAX_STEP_DIGITS}}})")
        elif field in keys:
            raise ConfigError(f"series pattern {template!r}: {{{field}}} appears twice")
        else:
            keys.append(field)
            if new and len(keys) > MAX_KEYS:
                raise ConfigError(f"series pattern {template!r}: at most {MAX_KEYS} "
                                  f"placeholders besides {{step}}")
            regex.append(f"(?P<{field}>.+?)")
    if steps != 1:
        raise ConfigError(f"series pattern {template!r} must contain {{step}} exactly once")
    return Pattern(template, re.compile("".join(regex), re.DOTALL), tuple(keys))
