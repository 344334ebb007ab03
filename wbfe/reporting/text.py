"""Cell and value formatting shared by the HTML and Markdown renderers."""

from __future__ import annotations

import json
import re
from typing import Any

from wbfe.render.text import format_value, is_number

__all__ = ["visible", "display"]

# C0/C1 control characters (not tab/newline): shown as \xNN so a tensor name cannot hide text or
# break a table; a lone surrogate becomes \udXXX the same way.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: Any) -> str:
    """``text`` with every control character written out as ``\\xNN`` (and encodable as UTF-8)."""
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def display(value: Any, nested: bool = False) -> str:
    """The text of one cell or value: numbers rounded as in ``wbfe score``'s table, containers compact."""
    if value is None:
        return ""
    if isinstance(value, dict):
        text = ("; " if not nested else ", ").join(f"{k} = {display(v, True) if v is not None else 'null'}"
                                                   for k, v in value.items())
        return f"({text})" if nested else text
    if isinstance(value, (list, tuple)) and not all(is_number(v) for v in value):
        return ", ".join(display(v) for v in value)
    if isinstance(value, (list, tuple)) and not value:
        return "[]"
    if isinstance(value, bool):
        return json.dumps(value)
    return visible(format_value(value))
