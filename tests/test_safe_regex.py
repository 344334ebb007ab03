"""The --layers safety check (issue 33): known-bad patterns refused, known-good ones accepted.

The bad ones are not merely declared bad: each is timed against Python's own matcher on a name
built to make it backtrack, and its time must grow much faster than the name (a pattern the check
refuses must really be slow to match, and a pattern it accepts must stay fast on long names).
"""

from __future__ import annotations

import re
import time

import pytest

from wbfe.errors import InvalidOptionError
from wbfe.options import CompareOptions, ScoreOptions, WatchOptions, compile_layers
from wbfe.options.safe_regex import unsafe_reason

# (pattern, repeated unit, tail that makes the match fail): the adversarial name is unit * n + tail.
BAD = [
    (r"(a+)+$", "a", "!"),
    (r"(a*)*$", "a", "!"),
    (r"(a|a)*$", "a", "!"),
    (r"(?:a|a)*$", "a", "!"),
    (r"(a|a)+$", "a", "!"),
    (r"(a|aa)*$", "a", "!"),
    (r"(aa|a)*$", "a", "!"),
    (r"(a{1,9}){1,9}$", "a", "!"),
    (r"(a{1,9})+$", "a", "!"),
    (r"(a+){1,9}$", "a", "!"),
    (r"(a?){24}a{24}", "a", ""),
    (r"(ab|\wb)*$", "ab", "!"),
    (r"(x(a|aa)a)+$", "xaaa", "!"),
    (r"(a|[^b])*$", "a", "!"),
    (r"([a-c]x|bx)*$", "bx", "!"),
    (r"([^a-c]|d)*$", "d", "a"),
    (r"(.|a)*$", "a", "\n\n"),
    (r"((a|aa)*)$", "a", "!"),
    (r"((ab)+)+$", "ab", "!"),
    (r"(\w+\s?)*$", "ab ", "!"),
    (r"^(([a-z])+.)+[A-Z]([a-z])+$", "ab", "!"),
]

GOOD = [
    r"layers\.\d+\.mlp", r"(q|k|v)_proj", r"^(?:encoder|decoder)\.", r"blocks\.(\d{1,3}\.)+weight",
    r"(a++)+x", r"fc\d*$", r"(?>a+)+b", r"(a|ab)*$", r"(ab|ac)*$", r"(?:\w+\.){2}weight$", r"(foo|bar)+$",
    r"(x(a|aa)y)+$", r".*attn.*", r"(.*\.)?weight$", r"head", r"(?:\.\d{1,3}){1,4}$", r"(a|[ab])*$",
    r"model\.layers\.(?:[0-9]|1[0-5])\.self_attn\.(q|k|v|o)_proj\.weight", r"(?:\bx|y)+$",
    # a repeated group that ends with a character its inner repeat cannot match splits a name one way only
    r"(\w+\.)*weight", r"layers\.(\d+\.)*mlp", r"^model\.(layers\.\d+\.)+self_attn", r"(\w*\.)*weight$",
]


def _seconds(pattern: str, text: str) -> float:
    compiled = re.compile(pattern)
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        compiled.search(text)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("pattern,unit,tail", BAD, ids=[b[0] for b in BAD])
def test_known_bad_pattern_is_refused(pattern: str, unit: str, tail: str) -> None:
    assert unsafe_reason(pattern) is not None
    with pytest.raises(InvalidOptionError, match="can take exponential time to match") as caught:
        compile_layers(pattern)
    assert "\n" not in str(caught.value)
    for options in (ScoreOptions, CompareOptions, WatchOptions):
        with pytest.raises(InvalidOptionError):
            options(layers=pattern)
    with pytest.raises(InvalidOptionError, match="--map"):
        CompareOptions(name_map=[f"{pattern}=x"])


@pytest.mark.parametrize("pattern,unit,tail", [b for b in BAD if b[0] in (
    r"(a|a)*$", r"(a|aa)*$", r"(a{1,9})+$", r"(ab|\wb)*$")], ids=lambda v: str(v))
def test_refused_pattern_really_backtracks(pattern: str, unit: str, tail: str) -> None:
    """Eight more units multiply the time by far more than the 8/12 a linear matcher would add."""
    short = _seconds(pattern, unit * 12 + tail)
    long = _seconds(pattern, unit * 20 + tail)
    assert long > 10 * max(short, 1e-5), (short, long)


@pytest.mark.parametrize("pattern", GOOD)
def test_known_good_pattern_is_accepted_and_fast(pattern: str) -> None:
    assert unsafe_reason(pattern) is None
    assert compile_layers(pattern) is not None
    # A long hostile name: repeats of every literal character the pattern holds, then a mismatch.
    alphabet = "".join(sorted({ch for ch in pattern if ch.isalnum() or ch in "._"})) or "a"
    assert _seconds(pattern, alphabet * 400 + "!") < 0.5


def test_invalid_expression_is_a_typed_error() -> None:
    with pytest.raises(InvalidOptionError, match="--layers is not a valid regular expression"):
        compile_layers("(")
    with pytest.raises(InvalidOptionError, match="^--layers is empty: leave --layers out for every tensor$"):
        ScoreOptions(layers="")


def test_a_back_reference_inside_a_repeat_is_taken_to_match_anything() -> None:
    """The check cannot know what a group holds: (a)(?:\\1|b)+ is refused as (?:.|b)+ would be."""
    assert unsafe_reason(r"(a)(?:\1|b)+$") == "two alternatives inside a repeat can start with the same character"
