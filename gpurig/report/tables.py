"""Rows as a table that fits the terminal, as TSV for scripts, or as JSON: one data shape, three formats.

A table never cuts a value short with an ellipsis: cells wrap, and when even
wrapped words cannot fit, the least important columns are left out (their
names are said under the table; ``--format tsv`` or ``json`` show them all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpurig import __version__
from gpurig.files import to_json
from gpurig.strict.validate import printable

FORMATS = ("table", "tsv", "json")
# A word longer than this may fold inside a cell instead of claiming the whole width.
_LONGEST_WORD = 24
_PADDING = 2  # one space on each side of a cell


@dataclass(frozen=True)
class Column:
    """One column: its header, how soon it is dropped when space runs out (higher goes first), cell styles."""

    name: str
    drop: int = 0  # 0 is never dropped; among the rest the highest goes first
    styles: Mapping[str, str] = field(default_factory=dict)  # cell value -> rich style
    key: str = ""  # the key in JSON output; the name with '_' for spaces if empty

    @property
    def json_key(self) -> str:
        return self.key or self.name.lower().replace(" ", "_")


Row = Sequence[str]


def fit_columns(columns: Sequence[Column], rows: Sequence[Row], width: int) -> list[int]:
    """Indexes of the columns to show so that every column fits ``width`` with whole (or long, folded) words."""
    shown = list(range(len(columns)))
    while True:
        droppable = [i for i in shown if columns[i].drop > 0]
        if _needed(columns, rows, shown) <= width or not droppable:
            return shown
        # highest drop first; among equals the rightmost
        shown.remove(max(droppable, key=lambda i: (columns[i].drop, i)))


def _needed(columns: Sequence[Column], rows: Sequence[Row], shown: Sequence[int]) -> int:
    return sum(_min_width(columns[i], [r[i] for r in rows]) + _PADDING for i in shown) + len(shown) - 1


def _min_width(column: Column, cells: Sequence[str]) -> int:
    header = max((len(w) for w in column.name.split()), default=1)
    words = [len(w) for cell in cells for w in str(cell).split()]
    return max(header, min(max(words, default=1), _LONGEST_WORD))


def rich_table(columns: Sequence[Column], rows: Sequence[Row], width: int, title: str | None = None) -> Table:
    """A rich Table of the columns that fit ``width``; a caption names those left out."""
    shown = fit_columns(columns, rows, width)
    dropped = [columns[i].name for i in range(len(columns)) if i not in shown]
    caption = f"not shown at {width} columns: {', '.join(dropped)} (see --format tsv)" if dropped else None
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left", caption_justify="left")
    # When they fit, each column's longest word is its minimum, so that rich wraps between words, not inside them.
    fits = _needed(columns, rows, shown) <= width
    for i in shown:
        minimum = _min_width(columns[i], [r[i] for r in rows]) if fits else None
        table.add_column(columns[i].name, overflow="fold", min_width=minimum)
    for row in rows:
        # Text, not a markup string, and printable: a cell is data (a host name, a reason), never markup or an escape sequence
        table.add_row(*(Text(printable(row[i], newlines=True), style=columns[i].styles.get(str(row[i]), "")) for i in shown))
    return table


def tsv(columns: Sequence[Column], rows: Sequence[Row]) -> str:
    """A header line and one line per row, tab-separated; tabs and newlines inside cells become spaces."""
    clean = lambda cell: " ".join(printable(cell, newlines=True).split())  # noqa: E731
    lines = ["\t".join(c.name for c in columns)]
    lines += ["\t".join(clean(cell) for cell in row) for row in rows]
    return "\n".join(lines) + "\n"


def document(schema: str, body: Mapping[str, Any], **meta: Any) -> dict[str, Any]:
    """A JSON report: ``schema`` (name/version), gpurig's version, extra metadata, then the body."""
    return {"schema": schema, "gpurig_version": __version__, **{k: v for k, v in meta.items() if v is not None}, **body}


def rows_document(schema: str, columns: Sequence[Column], rows: Sequence[Row], **meta: Any) -> dict[str, Any]:
    return document(schema, {"rows": [{c.json_key: cell for c, cell in zip(columns, row)} for row in rows]}, **meta)


def show(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Row],
    fmt: str = "table",
    *,
    title: str | None = None,
    doc: Mapping[str, Any] | None = None,
    schema: str = "",
) -> None:
    """Print rows as ``fmt``; JSON prints ``doc`` when given (a full report), else the rows under ``schema``."""
    if fmt == "json":
        data = doc if doc is not None else rows_document(schema, columns, rows)
        console.file.write(to_json(data, default=str))
        console.file.flush()
    elif fmt == "tsv":
        console.file.write(tsv(columns, rows))
        console.file.flush()
    elif len(rows) > PLAIN_ROWS:
        console.file.write(plain_columns(columns, rows))
        console.file.flush()
    elif (lines := unwrapped_table(columns, rows, console.width, title)) is not None:
        console.print(lines, soft_wrap=True)
    else:
        console.print(rich_table(columns, rows, console.width, title), soft_wrap=False)


def unwrapped_table(columns: Sequence[Column], rows: Sequence[Row], width: int, title: str | None = None) -> Text | None:
    """The table ``rich_table`` draws, drawn without rich's layout where no line of a cell wraps; None where one would.

    rich measures and renders each cell (about 2 ms a row of the facts table):
    a thousand hosts' facts spent longer drawing the table than reading their
    answers. When no column is dropped, no line of a cell wraps and every
    value is ASCII, the layout is plain arithmetic: each column as wide as its
    longest line, three spaces apart, a row as tall as its tallest cell, the
    header bold and ruled, as rich draws it.
    """
    cells = [[printable(row[i], newlines=True).split("\n") for i in range(len(columns))] for row in rows]
    widths = [max([len(c.name), *(len(line) for r in cells for line in r[i])]) for i, c in enumerate(columns)]
    total = sum(widths) + 3 * (len(columns) - 1)
    if not columns or total > width or (title and len(title) > total) or fit_columns(columns, rows, width) != list(range(len(columns))):
        return None
    if not all(line.isascii() and line.isprintable() for r in cells for cell in r for line in cell) or not all(c.name.isascii() for c in columns):
        return None
    text = Text()
    if title:
        text.append(title.ljust(total) + "\n", style="table.title")
    for i, c in enumerate(columns):
        text.append(c.name.ljust(widths[i]), style="table.header")
        if i < len(columns) - 1:  # rich's padding takes the header's style, the separator between does not
            text.append(" ", style="table.header")
            text.append(" ")
            text.append(" ", style="table.header")
    text.append("\n" + "\u2500" * total)
    for row, printed in zip(rows, cells):
        for k in range(max(len(cell) for cell in printed)):
            text.append("\n")
            for i, c in enumerate(columns):
                if k < len(printed[i]):
                    text.append(printed[i][k].ljust(widths[i]), style=c.styles.get(str(row[i]), ""))
                else:  # below a shorter cell: rich's blank, unstyled
                    text.append(" " * widths[i])
                if i < len(columns) - 1:
                    text.append("   ")
    return text


# rich spends ~0.25 ms a row measuring cells: 20,000 hosts would take 5 s to draw, so long listings are plain columns.
PLAIN_ROWS = 1000


def plain_columns(columns: Sequence[Column], rows: Sequence[Row]) -> str:
    """Left-aligned columns, two spaces apart, a header line first: what `ls -l`-style tools print."""
    header = [c.name for c in columns]
    cells = [[" ".join(printable(cell, newlines=True).split()) for cell in row] for row in rows]
    widths = [max(len(header[i]), *(len(r[i]) for r in cells)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*r).rstrip() for r in (header, *cells)) + "\n"
