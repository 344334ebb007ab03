"""Refuse user regular expressions that Python's backtracking matcher can take exponential time on.

``--layers`` and ``--map`` patterns are matched against every tensor name, which whoever made the checkpoint
chose, and a time limit on ``re`` is impossible (the matcher holds the interpreter), so the shape of the parse
tree ``re._parser`` builds is checked by one conservative rule (:meth:`_Checker.ambiguous`): it refuses a
repeat whose body can split a name in more than one way, which some harmless patterns can, never a harmful
one of these shapes. A repeat whose body splits one way only (``(\\w+\\.)*weight``) stays linear at each
start, quadratic over a search like ``.*x$``, and is accepted.
"""

from __future__ import annotations

import itertools
import re
from re import _constants as _c  # type: ignore[attr-defined]
from re import _parser as _p  # type: ignore[attr-defined]
from typing import Any, Callable, Iterable, Optional

__all__ = ["unsafe_reason"]

_Pred = Callable[[str], bool]
_Seq = Iterable[tuple[Any, Any]]

# Characters that stand in for "every character" when two character classes are intersected:
# ASCII, Latin-1 and a few others of each Unicode category re's classes test.
_SAMPLE = [chr(c) for c in range(0x300)] + ["\u0660", "\u2028", "\u3000", "\u4e00", "\U0001d7ce", "\uff10"]
_CATEGORY_RE = {
    "CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S", "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W",
}


def _any(ch: str) -> bool:
    return True


def _one_char(op: Any, arg: Any) -> Optional[_Pred]:
    """A predicate for the characters a one-character node matches (None: not such a node)."""
    if op is _c.LITERAL or op is _c.NOT_LITERAL:
        return lambda ch: (ord(ch) == arg) != (op is _c.NOT_LITERAL)
    if op is _c.ANY:
        return _any
    if op is _c.IN:
        return _in_set(arg)
    return None


def _between(low: int, high: int) -> _Pred:
    return lambda ch: low <= ord(ch) <= high


def _in_set(items: _Seq) -> _Pred:
    negate = False
    preds: list[_Pred] = []
    for op, arg in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.RANGE or op is _c.RANGE_UNI_IGNORE:
            preds.append(_between(arg[0], arg[1]))
        elif op is _c.CATEGORY:
            preds.append(re.compile(_CATEGORY_RE.get(str(arg), r"[\s\S]")).match)  # type: ignore[arg-type]
        else:
            preds.append(_one_char(op, arg) or _any)
    return lambda ch: any(p(ch) for p in preds) != negate


def _meet(a: list[_Pred], b: list[_Pred]) -> bool:
    """Whether some character satisfies a predicate of ``a`` and one of ``b``."""
    return bool(a and b) and any(any(p(ch) for p in a) and any(q(ch) for q in b) for ch in _SAMPLE)


_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT)


class _Checker:
    """First-character sets, nullability and width of parse-tree nodes, and the rule."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def parts(self, op: Any, arg: Any) -> list[Any]:
        """The sequences inside a node that consumes text: a repeat's body, a group's, an alternation's branches."""
        if op is _c.POSSESSIVE_REPEAT or op is _c.ATOMIC_GROUP:
            return [arg[2] if op is _c.POSSESSIVE_REPEAT else arg]
        return [] if op is _c.ASSERT or op is _c.ASSERT_NOT else self.backtracked(op, arg)

    def backtracked(self, op: Any, arg: Any) -> list[Any]:
        """The sequences inside a node the matcher can backtrack into (not possessive or atomic ones)."""
        if op in _REPEATS:
            return [arg[2]]
        if op is _c.SUBPATTERN:
            return [arg[-1]]
        if op is _c.BRANCH:
            return list(arg[1])
        return [arg[1]] if op is _c.ASSERT or op is _c.ASSERT_NOT else []

    def first(self, seq: _Seq) -> tuple[list[_Pred], bool]:
        """Predicates for the characters that can start a match of ``seq``, and whether it can match ''."""
        preds: list[_Pred] = []
        for op, arg in seq:
            node_first, nullable = self.first_of(op, arg)
            preds += node_first
            if not nullable:
                return preds, False
        return preds, True

    def first_of(self, op: Any, arg: Any) -> tuple[list[_Pred], bool]:
        single = _one_char(op, arg)
        if single is not None:
            return [single], False
        if op is _c.GROUPREF or op is _c.GROUPREF_EXISTS:
            return [_any], True  # a back-reference can hold anything
        found = [self.first(seq) for seq in self.parts(op, arg)]
        if not found:
            return [], True  # anchors and look-arounds consume nothing
        nullable = any(n for _, n in found) or (op in _REPEATS or op is _c.POSSESSIVE_REPEAT) and arg[0] == 0
        return [p for preds, _ in found for p in preds], nullable

    def chars(self, seq: _Seq) -> list[_Pred]:
        """Predicates for every character ``seq`` can consume, anywhere in its match."""
        out: list[_Pred] = []
        for op, arg in seq:
            single = _one_char(op, arg)
            if single is not None or op is _c.GROUPREF or op is _c.GROUPREF_EXISTS:
                out.append(single or _any)
            else:
                out += [p for part in self.parts(op, arg) for p in self.chars(part)]
        return out

    def ambiguous(self, seq: _Seq) -> Optional[str]:
        """The rule, anywhere in ``seq``: inside a repeat that can run more than once, an element of variable width
        whose characters can also start what follows it within the repeat (the rest of the body, then the body
        again: ``(a{1,9}){1,9}``, ``(a|aa)*``, ``(a?){20}``), or an alternation whose branches can start with the
        same character (``(a|[ab])*``) or that has two empty branches (``(a|a)*``, which ``re`` factors into
        ``a(?:|)``)."""
        for op, arg in seq:
            if op in _REPEATS and arg[1] > 1:
                reason = self.body(list(arg[2]), self.first(arg[2])[0])
                if reason:
                    return reason
            reason = next(filter(None, (self.ambiguous(part) for part in self.backtracked(op, arg))), None)
            if reason:
                return reason
        return None

    def body(self, seq: list[tuple[Any, Any]], after: list[_Pred]) -> Optional[str]:
        """Check the elements of a repeated body; ``after`` starts what may follow ``seq``."""
        for i, (op, arg) in enumerate(seq):
            if op is _c.POSSESSIVE_REPEAT or op is _c.ATOMIC_GROUP:
                continue
            rest_first, rest_null = self.first(seq[i + 1:])
            follow = rest_first + (after if rest_null else [])
            if op is _c.SUBPATTERN:
                reason = self.body(list(arg[-1]), follow)
            else:
                reason = self.branch(arg[1], follow) if op is _c.BRANCH else None
                low, high = _p.SubPattern(self.state, [(op, arg)]).getwidth()
                if not reason and low != high and _meet(self.chars([(op, arg)]), follow):
                    reason = "a part of variable length can also match the start of what follows it inside a repeat"
            if reason:
                return reason
        return None

    def branch(self, branches: list[Any], follow: list[_Pred]) -> Optional[str]:
        firsts = [self.first(b) for b in branches]
        if sum(1 for _, nullable in firsts if nullable) > 1:
            return "two alternatives inside a repeat can both match the empty text"
        if any(_meet(a[0], b[0]) for a, b in itertools.combinations(firsts, 2)):
            return "two alternatives inside a repeat can start with the same character"
        return next(filter(None, (self.body(list(b), follow) for b in branches)), None)


def unsafe_reason(pattern: str) -> Optional[str]:
    """Why ``pattern`` can take exponential (or high-polynomial) time to match, as a short phrase for an
    error message; None when it is safe.

    Raises:
        re.error: ``pattern`` is not a valid regular expression.
    """
    tree = _p.parse(pattern)
    return _Checker(tree.state).ambiguous(tree)
