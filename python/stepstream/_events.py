"""Shared by the callback integrations: a run started lazily on rank 0, steps timed, numbers
kept, and events a framework adds later ignored rather than raised on."""

from __future__ import annotations

import math
import numbers
import time
from typing import Any, Mapping, Optional

import stepstream


def scalar(value: Any) -> Any:
    """A number, a 0-d tensor (held by ``log``), or ``None`` for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Number):
        return float(value)
    if hasattr(value, "detach") or hasattr(value, "asnumpy"):
        return value
    if hasattr(value, "shape") and getattr(value, "size", 2) == 1:  # numpy scalars and arrays
        return float(value.reshape(-1)[0])
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return scalar(value[0])
    return None


def numeric(logs: Optional[Mapping[str, Any]], skip=()) -> dict:
    out = {}
    for k, v in (logs or {}).items():
        if k in skip:
            continue
        s = scalar(v)
        if s is not None:
            out[str(k)] = s
    return out


class Throughput:
    """Step time and tokens per second from successive steps."""

    def __init__(self):
        self.last_time: Optional[float] = None
        self.last_tokens: Optional[float] = None

    def step(self, tokens: Optional[float] = None) -> dict:
        now = time.perf_counter()
        out = {}
        if self.last_time is not None:
            dt = now - self.last_time
            out["step_time"] = dt
            if tokens is not None and self.last_tokens is not None and dt > 0:
                out["tokens_per_sec"] = (tokens - self.last_tokens) / dt
        if tokens is not None:
            out["tokens_seen"] = float(tokens)
            self.last_tokens = tokens
        self.last_time = now
        return out


class Lazy:
    """Holds ``stepstream.init`` arguments until training begins."""

    def __init__(self, framework: str, init_kwargs: dict):
        self.kwargs = dict(init_kwargs)
        self.kwargs.setdefault("framework", framework)
        self.run: Optional[stepstream.Run] = None

    def start(self, config: Optional[Mapping[str, Any]] = None, name: Optional[str] = None) -> stepstream.Run:
        if self.run is None:
            kw = dict(self.kwargs)
            if config and not kw.get("config"):
                kw["config"] = config
            if name and not kw.get("name"):
                kw["name"] = name
            self.run = stepstream.init(**kw)
        return self.run

    def log(self, values: Mapping[str, Any], step: int) -> None:
        if self.run is not None and values:
            self.run.log(dict(values), step=int(step))

    def finish(self, status: str = "finished", message: Optional[str] = None) -> None:
        if self.run is not None and self.run.active:
            self.run.finish(status, message)


def finite(x: Any) -> bool:
    return isinstance(x, float) and math.isfinite(x)
