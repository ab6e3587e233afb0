"""Samples logged beside scalars: ``run.log({"generation": stepstream.Text(s)}, step=...)``.

A sample is stored by the hub under its key at its step, shown in the web app's panels with
a step slider, and read back with ``GET /api/runs/{id}/samples?key=``. A bad one (too big,
a table with ragged rows) is a ``UserWarning`` when logged, and the rest of the record goes
on: a sample never stops a training.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence


class Text:
    """A text sample: a model's generation, a decoded batch, a prompt."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"stepstream.Text takes a str, not {type(text).__name__}")
        self.text = text

    def __stepstream_sample__(self):
        return ("text", self.text)

    def __repr__(self) -> str:
        short = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return f"Text({short!r})"


class Table:
    """Rows under named columns (prompt, response, reward...). Cells that are numbers stay
    numbers; anything else is shown as its ``str``. ``data`` is an alias of ``rows``; a
    pandas DataFrame is taken as it is (its columns and rows)."""

    __slots__ = ("columns", "rows")

    def __init__(
        self,
        columns: Optional[Sequence[str]] = None,
        rows: Optional[Iterable[Sequence[Any]]] = None,
        data: Optional[Iterable[Sequence[Any]]] = None,
        dataframe: Any = None,
    ):
        if dataframe is not None:
            columns = [str(c) for c in dataframe.columns]
            rows = dataframe.itertuples(index=False)
        rows = rows if rows is not None else data
        if columns is None:
            raise TypeError("stepstream.Table needs columns=[...]")
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            raise TypeError("stepstream.Table's columns must be a list of str")
        self.columns = list(columns)
        self.rows = [list(r) for r in (rows or [])]

    def add_row(self, *cells: Any) -> None:
        self.rows.append(list(cells))

    def __stepstream_sample__(self):
        return ("table", self.columns, self.rows)

    def __repr__(self) -> str:
        return f"Table(columns={self.columns!r}, rows=[{len(self.rows)} rows])"
