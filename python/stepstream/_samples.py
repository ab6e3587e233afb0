"""Samples logged beside scalars: ``run.log({"generation": stepstream.Text(s)}, step=...)``.

A sample is stored by the hub under its key at its step, shown in the web app's panels with
a step slider, and read back with ``GET /api/runs/{id}/samples?key=``. A bad one (too big,
a table with ragged rows) is a ``UserWarning`` when logged, and the rest of the record goes
on: a sample never stops a training.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence


class Text(str):
    """A text sample: a model's generation, a decoded batch, a prompt. A ``str`` itself, so
    a framework that keeps its logs as JSON (the HF ``Trainer``'s log history) keeps it."""

    __slots__ = ()

    def __new__(cls, text: str):
        if not isinstance(text, str):
            raise TypeError(f"stepstream.Text takes a str, not {type(text).__name__}")
        return super().__new__(cls, text)

    @property
    def text(self) -> str:
        return str.__str__(self)

    def __stepstream_sample__(self):
        return ("text", str.__str__(self))

    def __repr__(self) -> str:
        s = str.__str__(self)
        short = s if len(s) <= 40 else s[:37] + "..."
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


def _numpy_pack(x: Any, bins: int):
    import numpy as np

    a = np.asarray(x).reshape(-1)
    if a.dtype.kind not in "fiub":
        a = a.astype(np.float64)
    head = [0.0, 0.0, 0.0, 0.0, 0.0]
    f = a
    # In the values' own dtype (no float64 copy of a large float32 tensor); non-finite
    # values counted apart only when there are any.
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        head[2:] = [float(np.isnan(a).sum()), float(np.isposinf(a).sum()), float(np.isneginf(a).sum())]
        f = a[np.isfinite(a)]
    if f.size:
        lo, hi = float(f.min()), float(f.max())
        if hi <= lo:
            lo, hi = lo - 0.5, lo + 0.5
        counts, _ = np.histogram(f, bins=bins, range=(lo, hi))
        head[0], head[1] = lo, hi
        return np.concatenate([np.array(head), counts.astype(np.float64)])
    return np.concatenate([np.array(head), np.zeros(bins)])


def _torch_pack(t: Any, bins: int):
    """The histogram computed on the tensor's device, with no host sync: ``[lo, hi, nan,
    +inf, -inf, counts...]`` as one small tensor (read with the next batch of records)."""
    import torch

    x = t.detach().reshape(-1).to(torch.float32)
    if x.numel() == 0:
        return torch.zeros(5 + bins, dtype=torch.float32, device=x.device)
    finite = torch.isfinite(x)
    inf = torch.full((), float("inf"), device=x.device)
    lo = torch.where(finite, x, inf).min()
    hi = torch.where(finite, x, -inf).max()
    # All equal: one bin around the value.
    same = hi <= lo
    lo = torch.where(same, lo - 0.5, lo)
    hi = torch.where(same, hi + 0.5, hi)
    safe = torch.where(finite, x, lo)
    idx = ((safe - lo) / (hi - lo) * bins).to(torch.int64).clamp_(0, bins - 1)
    counts = torch.zeros(bins, dtype=torch.float32, device=x.device)
    counts.scatter_add_(0, idx, finite.to(torch.float32))
    head = torch.stack([lo, hi, torch.isnan(x).sum().float(), torch.isposinf(x).sum().float(),
                        torch.isneginf(x).sum().float()])
    return torch.cat([head, counts])


class Histogram:
    """The distribution of a tensor's values (a layer's weights or gradients) in ``bins``
    equal bins over its finite range, NaN and infinities counted apart. A PyTorch tensor's
    is computed on its device with no host sync, and read with the next batch of records;
    numpy arrays and lists on the host; MindSpore and Paddle tensors are read to the host
    first (one copy each)."""

    __slots__ = ("pack",)

    def __init__(self, values: Any, bins: int = 64):
        if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 4096:
            raise ValueError(f"bins must be an int from 1 to 4096, not {bins!r}")
        module = type(values).__module__.split(".", 1)[0]
        if module == "torch" and values.device.type != "cpu":
            self.pack = _torch_pack(values, bins)
        elif module == "torch":
            # On the CPU there is nothing to sync with: numpy's histogram is the faster.
            self.pack = _numpy_pack(values.detach().reshape(-1).float().numpy(), bins)
        elif module == "mindspore" and hasattr(values, "asnumpy"):
            self.pack = _numpy_pack(values.asnumpy(), bins)
        elif module == "paddle" and hasattr(values, "numpy"):
            self.pack = _numpy_pack(values.numpy(), bins)
        else:
            try:
                self.pack = _numpy_pack(values, bins)
            except (TypeError, ValueError) as e:
                raise TypeError(f"stepstream.Histogram takes a tensor, an array or numbers: {e}") from None

    @property
    def __stepstream_pack__(self):
        return self.pack

    def __stepstream_sample__(self):
        return ("histogram", self.pack)

    def __repr__(self) -> str:
        return f"Histogram({int(self.pack.shape[0]) - 5} bins)"


def _pixels(values: Any):
    """An image as uint8 pixels, (H, W, C): from a PIL image, a numpy array, or a tensor
    (PyTorch, MindSpore, Paddle: read to the host), HWC or CHW, uint8 or float in [0, 1]."""
    import numpy as np

    if hasattr(values, "convert") and hasattr(values, "size") and hasattr(values, "mode"):
        # PIL: its own modes to one numpy can hold.
        if values.mode not in ("L", "LA", "RGB", "RGBA"):
            values = values.convert("RGBA" if "A" in values.mode else "RGB")
        a = np.asarray(values)
    elif hasattr(values, "detach"):
        a = values.detach().cpu().numpy()
    elif hasattr(values, "asnumpy"):
        a = values.asnumpy()
    elif type(values).__module__.split(".", 1)[0] == "paddle":
        a = values.numpy()
    else:
        a = np.asarray(values)
    if a.ndim == 3 and a.shape[0] in (1, 2, 3, 4) and a.shape[2] not in (1, 2, 3, 4):
        a = np.transpose(a, (1, 2, 0))  # CHW
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3:
        return None, f"an image is H x W or H x W x C (or C x H x W), not of shape {tuple(a.shape)}"
    if a.shape[2] not in (1, 2, 3, 4):
        return None, (f"an image has 1 to 4 channels, not {a.shape[2]} (shape {tuple(a.shape)}; "
                      "a volume or a batch is not one image)")
    if a.dtype != np.uint8:
        f = a.astype(np.float64)
        if not np.isfinite(f).all():
            return None, "an image holds NaN or infinite values"
        if f.size and f.min() >= 0.0 and f.max() <= 1.0:
            f = f * 255.0
        a = np.clip(np.rint(f), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a), None


class Image:
    """An image sample: a numpy array, a PIL image or a tensor, H x W (gray), H x W x C or
    C x H x W with 1 to 4 channels, uint8 or float in [0, 1]. Encoded as PNG (or JPEG with
    ``format="jpeg"``) on the collector's thread, not the training's; shown in the web
    app's gallery with a step slider. A bad one (a volume, NaN, too large once encoded) is a
    ``UserWarning`` when logged, and the rest of the record goes on."""

    __slots__ = ("pixels", "error", "caption", "format", "quality")

    def __init__(self, values: Any, caption: str = "", format: str = "png", quality: int = 90):
        if format not in ("png", "jpeg"):
            raise ValueError(f"format must be png or jpeg, not {format!r}")
        self.pixels, self.error = _pixels(values)
        self.caption = str(caption)
        self.format = format
        self.quality = int(quality)

    def __stepstream_sample__(self):
        if self.error:
            raise ValueError(self.error)
        h, w, c = self.pixels.shape
        return ("image", self.pixels.tobytes(), w, h, c, self.format, self.quality, self.caption)

    def __repr__(self) -> str:
        if self.error:
            return f"Image(<bad: {self.error}>)"
        return f"Image({self.pixels.shape[1]}x{self.pixels.shape[0]}x{self.pixels.shape[2]})"
