"""Refuse user regular expressions that Python's backtracking matcher can take exponential time on.

``--layers`` and ``--map`` patterns are matched against every tensor name of a checkpoint, and a
checkpoint's names are chosen by whoever made it. Python's ``re`` backtracks, so a pattern that can
match the same text in several ways inside a repeat tries every way before it gives up:
``(a|a)*$`` on 22 a's and a ``!`` takes 1.3 s and doubles with each further ``a``;
``(a{1,9})+$`` 0.7 s; ``(a+){1,9}$`` and ``(a{1,9}){1,9}$`` 0.15 s, growing as n⁸ (measured on
this project's 2-core machine, CPython 3.12). A time limit is impossible (the matcher holds the
interpreter until it returns), so the pattern's shape is checked instead, on the parse tree
``re`` itself builds (after its own factoring: ``(a|ab)`` is already ``a(?:|b)``).

Two rules, both conservative (they refuse some harmless patterns, never a harmful one of these
shapes):

1. an unbounded repeat inside an unbounded repeat (``(a+)+``, ``(\\w*\\.)*``), unless the inner
   one is possessive or atomic;
2. inside any repeat that can run more than once (``*``, ``+``, ``{m,n}`` with n > 1), an element
   of variable width whose characters can also start what follows it within the repeat (the rest
   of the body, then the body again): ``(a{1,9}){1,9}``, ``(a|aa)*``, ``(a?){20}``; or an
   alternation there whose branches can start with the same character (``(a|[ab])*``) or that
   has two empty branches (``(a|a)*``, which ``re`` factors into ``a(?:|)``).

This module reaches into ``re._parser`` (the only parser of Python's own syntax); it is used by
:func:`wbfe.options.compile_layers` and nothing else.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Optional

__all__ = ["unsafe_reason"]

_Pred = Callable[[str], bool]

# Characters that stand in for "every character" when two character classes are intersected:
# ASCII, Latin-1 and a few others of each Unicode category re's classes test.
_SAMPLE = [chr(c) for c in range(0x300)] + ["\u0660", "\u2028", "\u3000", "\u4e00", "\U0001d7ce", "\uff10"]


def _modules() -> tuple[Any, Any]:
    from re import _constants as c  # type: ignore[attr-defined]  # noqa: PLC0415
    from re import _parser as p  # type: ignore[attr-defined]  # noqa: PLC0415

    return c, p


_CATEGORY_RE = {
    "CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S", "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W",
}


def _is(code: int) -> _Pred:
    return lambda ch: ord(ch) == code


def _is_not(code: int) -> _Pred:
    return lambda ch: ord(ch) != code


def _between(low: int, high: int) -> _Pred:
    return lambda ch: low <= ord(ch) <= high


def _matches(pattern: "re.Pattern[str]") -> _Pred:
    return lambda ch: pattern.match(ch) is not None


def _one_char(op: Any, arg: Any, c: Any) -> Optional[_Pred]:
    """A predicate for the characters a one-character node matches (None: not such a node)."""
    if op is c.LITERAL:
        return _is(arg)
    if op is c.NOT_LITERAL:
        return _is_not(arg)
    if op is c.ANY:
        return lambda ch: True
    if op is c.IN:
        return _in_set(arg, c)
    return None


def _in_set(items: Iterable[tuple[Any, Any]], c: Any) -> _Pred:
    negate = False
    preds: list[_Pred] = []
    for op, arg in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.RANGE or op is c.RANGE_UNI_IGNORE:
            preds.append(_between(arg[0], arg[1]))
        elif op is c.CATEGORY:
            preds.append(_matches(re.compile(_CATEGORY_RE.get(str(arg), r"[\s\S]"))))
        else:
            single = _one_char(op, arg, c)
            preds.append(single if single is not None else (lambda ch: True))
    if negate:
        return lambda ch: not any(p(ch) for p in preds)
    return lambda ch: any(p(ch) for p in preds)


def _meet(a: list[_Pred], b: list[_Pred]) -> bool:
    """Whether some character satisfies a predicate of ``a`` and one of ``b``."""
    if not a or not b:
        return False
    return any(any(p(ch) for p in a) and any(q(ch) for q in b) for ch in _SAMPLE)


class _Analysis:
    """First-character sets, nullability and width of parse-tree nodes."""

    def __init__(self) -> None:
        self.c, self.p = _modules()

    def width(self, item: tuple[Any, Any], state: Any) -> tuple[int, int]:
        return self.p.SubPattern(state, [item]).getwidth()

    def first(self, seq: Iterable[tuple[Any, Any]]) -> tuple[list[_Pred], bool]:
        """Predicates for the characters that can start a match of ``seq``, and whether it can match ''."""
        preds: list[_Pred] = []
        for op, arg in seq:
            node_first, nullable = self.first_of(op, arg)
            preds += node_first
            if not nullable:
                return preds, False
        return preds, True

    def first_of(self, op: Any, arg: Any) -> tuple[list[_Pred], bool]:
        c = self.c
        single = _one_char(op, arg, c)
        if single is not None:
            return [single], False
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            preds, nullable = self.first(arg[2])
            return preds, nullable or arg[0] == 0
        if op is c.SUBPATTERN:
            return self.first(arg[-1])
        if op is c.ATOMIC_GROUP:
            return self.first(arg)
        if op is c.BRANCH:
            preds, nullable = [], False
            for branch in arg[1]:
                b_first, b_null = self.first(branch)
                preds += b_first
                nullable = nullable or b_null
            return preds, nullable
        if op is c.GROUPREF or op is c.GROUPREF_EXISTS:
            return [lambda ch: True], True  # a back-reference can hold anything
        return [], True  # anchors and look-arounds consume nothing

    def chars(self, op: Any, arg: Any) -> list[_Pred]:
        """Predicates for every character a node can consume, anywhere in its match."""
        c = self.c
        single = _one_char(op, arg, c)
        if single is not None:
            return [single]
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            return self.chars_seq(arg[2])
        if op is c.SUBPATTERN:
            return self.chars_seq(arg[-1])
        if op is c.ATOMIC_GROUP:
            return self.chars_seq(arg)
        if op is c.BRANCH:
            return [pred for branch in arg[1] for pred in self.chars_seq(branch)]
        if op is c.GROUPREF or op is c.GROUPREF_EXISTS:
            return [lambda ch: True]
        return []

    def chars_seq(self, seq: Iterable[tuple[Any, Any]]) -> list[_Pred]:
        return [pred for op, arg in seq for pred in self.chars(op, arg)]


def _nested_unbounded(tree: Any, c: Any, inside: bool = False) -> bool:
    """Rule 1: an unbounded repeat inside an unbounded repeat (possessive and atomic ones excepted)."""
    for op, arg in tree:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT):
            unbounded = arg[1] == c.MAXREPEAT
            if unbounded and inside:
                return True
            if _nested_unbounded(arg[2], c, inside or unbounded):
                return True
        elif op is c.SUBPATTERN:
            if _nested_unbounded(arg[-1], c, inside):
                return True
        elif op is c.BRANCH:
            if any(_nested_unbounded(branch, c, inside) for branch in arg[1]):
                return True
        elif op in (c.ASSERT, c.ASSERT_NOT):
            if _nested_unbounded(arg[1], c, inside):
                return True
        # POSSESSIVE_REPEAT and ATOMIC_GROUP: the matcher never backtracks into them.
    return False


class _Ambiguity:
    """Rule 2: a repeat that can run more than once whose iterations can divide the text in two ways."""

    def __init__(self, state: Any) -> None:
        self.a = _Analysis()
        self.c = self.a.c
        self.state = state

    def tree(self, seq: Iterable[tuple[Any, Any]]) -> Optional[str]:
        """Look for an ambiguous repeat anywhere in ``seq``; the reason, or None."""
        c = self.c
        for op, arg in seq:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT):
                if arg[1] > 1:
                    body_first, _ = self.a.first(arg[2])
                    reason = self.body(list(arg[2]), body_first)
                    if reason:
                        return reason
                reason = self.tree(arg[2])
            elif op is c.SUBPATTERN:
                reason = self.tree(arg[-1])
            elif op is c.BRANCH:
                reason = next(filter(None, (self.tree(b) for b in arg[1])), None)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                reason = self.tree(arg[1])
            else:
                reason = None  # POSSESSIVE_REPEAT and ATOMIC_GROUP never backtrack
            if reason:
                return reason
        return None

    def body(self, seq: list[tuple[Any, Any]], after: list[_Pred]) -> Optional[str]:
        """Check the elements of a repeated body; ``after`` starts what may follow ``seq``."""
        c = self.c
        for i, (op, arg) in enumerate(seq):
            if op is c.POSSESSIVE_REPEAT or op is c.ATOMIC_GROUP:
                continue
            rest_first, rest_null = self.a.first(seq[i + 1:])
            follow = rest_first + (after if rest_null else [])
            if op is c.SUBPATTERN:
                reason = self.body(list(arg[-1]), follow)
                if reason:
                    return reason
                continue
            if op is c.BRANCH:
                reason = self.branch(arg[1], follow)
                if reason:
                    return reason
            low, high = self.a.width((op, arg), self.state)
            if low != high and _meet(self.a.chars(op, arg), follow):
                return "a part of variable length can also match the start of what follows it inside a repeat"
        return None

    def branch(self, branches: list[Any], follow: list[_Pred]) -> Optional[str]:
        firsts = [self.a.first(b) for b in branches]
        if sum(1 for _, nullable in firsts if nullable) > 1:
            return "two alternatives inside a repeat can both match the empty text"
        for i in range(len(firsts)):
            for j in range(i + 1, len(firsts)):
                if _meet(firsts[i][0], firsts[j][0]):
                    return "two alternatives inside a repeat can start with the same character"
        return next(filter(None, (self.body(list(b), follow) for b in branches)), None)


def unsafe_reason(pattern: str) -> Optional[str]:
    """Why ``pattern`` can take exponential (or high-polynomial) time to match; None when it is safe.

    Args:
        pattern: a regular expression that ``re.compile`` accepts.

    Returns:
        A short phrase for an error message, or None.

    Raises:
        re.error: ``pattern`` is not a valid regular expression.
    """
    c, p = _modules()
    tree = p.parse(pattern)
    if _nested_unbounded(tree, c):
        return "repeats a repeated group without bound"
    return _Ambiguity(tree.state).tree(tree)

