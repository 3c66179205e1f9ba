"""Write the options table of docs/loader.md from the options' homes (``wdsprep/plan/options.py``).

    python tools/docs_options.py          # rewrite the table between its markers
    python tools/docs_options.py --check  # exit 1 if the table is not the homes' (what the tests check)
"""

from __future__ import annotations

import sys
from pathlib import Path

from wdsprep.options import table
from wdsprep.plan.options import GROUPS, LoaderOptions

DOC = Path(__file__).resolve().parent.parent / "docs" / "loader.md"
BEGIN = "<!-- options table: written by tools/docs_options.py from wdsprep/plan/options.py -->"
END = "<!-- end of the options table -->"


def options_table() -> str:
    return table({"the epoch": LoaderOptions, **{title: cls for cls, title in GROUPS.values()}})


def with_table(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{options_table()}\n{END}{tail}"


if __name__ == "__main__":
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        sys.exit(f"{DOC}: no options table markers")
    new = with_table(text)
    if "--check" in sys.argv[1:]:
        sys.exit(0 if new == text else f"{DOC}: the options table is not the options' homes': run {__file__}")
    DOC.write_text(new, encoding="utf-8")
