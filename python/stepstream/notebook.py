"""The live chart of a run in a Jupyter (or VS Code, Colab...) notebook's output.

    run = stepstream.init(project="llama", name="lr-3e-4")
    run.chart("loss")                        # the cell's output: the curve, moving live
    stepstream.chart("RUN_ID", ["loss", "lr"], hub="http://hub:7070", token=READ_TOKEN)

The output is the hub's embeddable widget: a ``div`` with ``data-stepstream-run`` and the hub's
``embed.js``, which the notebook's browser loads from the hub. The notebook's page is another
origin than the hub, so start the hub with ``--allow-origin`` naming it (Jupyter's default is
``http://localhost:8888``). On a hub that guards reads, pass a read token, ideally one scoped
to the run (``stepstream token --tokens FILE --run RUN_ID``): the token is written into the
notebook's output, and a notebook is often shared. The collector's write token is never used.
"""

from __future__ import annotations

import html
import os
from typing import Iterable, Optional, Union

__all__ = ["chart", "Chart"]


def _http(hub: str) -> str:
    hub = hub.strip().rstrip("/")
    if hub.startswith("ws://") or hub.startswith("wss://"):
        hub = "http" + hub[2:]
    if not (hub.startswith("http://") or hub.startswith("https://")):
        raise ValueError(f"hub {hub!r}: give the hub's http(s) or ws(s) address")
    return hub


def _names(value: Union[str, Iterable[str]]) -> str:
    items = [value] if isinstance(value, str) else list(value)
    items = [str(i).strip() for i in items if str(i).strip()]
    if not items:
        raise ValueError("name at least one run and one metric")
    return ",".join(items)


class Chart:
    """The widget's markup; notebooks display it through ``_repr_html_``."""

    def __init__(self, runs: str, metrics: str, hub: str, options: dict):
        self.runs = runs
        self.metrics = metrics
        self.hub = hub
        self.options = options

    def attributes(self) -> dict:
        attrs = {"data-stepstream-run": self.runs, "data-metric": self.metrics, "data-hub": self.hub}
        for name, value in self.options.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            attrs[f"data-{name}"] = str(value)
        return attrs

    def html(self) -> str:
        attrs = " ".join(f'{k}="{html.escape(v, quote=True)}"' for k, v in self.attributes().items())
        hub = html.escape(self.hub, quote=True)
        fallback = html.escape(
            f"Loading the live chart of {self.runs} from {self.hub}. If this stays, the hub is "
            f"unreachable from this browser, or does not allow this notebook's origin "
            f"(stepstream serve --allow-origin ...)."
        )
        return (
            f'<div class="stepstream-chart" {attrs}>{fallback}</div>\n'
            f'<script src="{hub}/embed.js" async></script>'
        )

    def iframe_url(self) -> str:
        """The same chart as the hub's ``/embed`` page, for places that take only iframes."""
        from urllib.parse import urlencode

        query = {k[len("data-"):]: v for k, v in self.attributes().items() if k != "data-hub"}
        query["run"] = query.pop("stepstream-run")
        return f"{self.hub}/embed?{urlencode(query)}"

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return f"<stepstream chart of {self.runs} ({self.metrics}) from {self.hub}>"


def chart(
    run: Union[str, Iterable[str]],
    metric: Union[str, Iterable[str]] = "loss",
    *,
    hub: Optional[str] = None,
    token: Optional[str] = None,
    height: int = 300,
    smoothing: Optional[float] = None,
    log: Optional[bool] = None,
    x: Optional[str] = None,
    theme: Optional[str] = None,
    live: bool = True,
    title: Optional[str] = None,
) -> Chart:
    """The live chart of one run (or several, overlaid) for a notebook cell's output.

    hub: the hub's address (default ``$STEPSTREAM_HUB`` or ``http://127.0.0.1:7070``).
    token: a read token (default ``$STEPSTREAM_READ_TOKEN``), written into the output.
    x: ``step``, ``wall`` or ``relative``; theme: ``light``, ``dark`` or ``auto``.
    """
    if smoothing is not None and not 0 <= smoothing < 1:
        raise ValueError("smoothing is a weight in [0, 1)")
    if x is not None and x not in ("step", "wall", "relative"):
        raise ValueError("x is step, wall or relative")
    if theme is not None and theme not in ("light", "dark", "auto"):
        raise ValueError("theme is light, dark or auto")
    hub = _http(hub or os.environ.get("STEPSTREAM_HUB") or "http://127.0.0.1:7070")
    token = token or os.environ.get("STEPSTREAM_READ_TOKEN")
    options = {
        "token": token,
        "height": int(height),
        "smoothing": smoothing,
        "log": log,
        "x": x,
        "theme": theme,
        "live": live,
        "title": title,
    }
    return Chart(_names(run), _names(metric), hub, options)
