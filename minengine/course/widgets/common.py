"""What every lesson widget does alike: say why an input cannot be answered, and format times.

Why shared: a widget that shows an error must also hide its previous result (numbers from the old
input would read as the answer to the new one), and all of them should look and read the same way.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any


def error_message(results: Iterable[Any], css_class: str, heading: str, text: str) -> str:
    """Hide the result widgets and return the HTML of a readable error: '<heading>: <text>'."""
    for part in results:
        part.layout.display = "none"
    return (f"<div class='{css_class}' style='color:#b00020'><b>{html.escape(heading)}:</b> "
            f"{html.escape(text)}</div>")


def ms(seconds: float) -> str:
    """Seconds as milliseconds, with one decimal below 100 ms."""
    return f"{1000 * seconds:,.0f} ms" if seconds >= 0.0995 else f"{1000 * seconds:.1f} ms"
