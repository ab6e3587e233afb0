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
    """The numbers, tensors and samples (``stepstream.Text``, ``Table``, ``Histogram``,
    ``Image``) of a framework's logs; anything else is left out."""
    out = {}
    for k, v in (logs or {}).items():
        if k in skip:
            continue
        if hasattr(v, "__stepstream_sample__"):
            out[str(k)] = v
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


class Batches:
    """The per-batch bookkeeping a fit-loop callback shares (Keras, Paddle's hapi): the lr
    read at batch begin (the one this step applies), a global step, the epoch, step time."""

    def __init__(self, lazy: Lazy, lr_name: str):
        self.lazy = lazy
        self.lr_name = lr_name
        self.clock = Throughput()
        self.lr: Optional[Any] = None
        self.epoch = 0
        self.global_step = 0

    def begin(self, lr: Any) -> None:
        self.lr = scalar(lr) if lr is not None else None

    def end(self, logs: Optional[Mapping[str, Any]]) -> None:
        values = numeric(logs)
        values.update(self.clock.step())
        if self.lr is not None:
            values[self.lr_name] = self.lr
        values["epoch"] = float(self.epoch)
        self.lazy.log(values, self.global_step)
        self.global_step += 1

    def evaluated(self, values: Mapping[str, Any]) -> None:
        """Evaluation results, at the last training step done."""
        self.lazy.log(values, max(self.global_step - 1, 0))


class FitLoop:
    """What the fit-loop callbacks expose alike (mixed in before the framework's class)."""

    _lazy: Lazy
    _batches: Batches

    @property
    def global_step(self) -> int:
        return self._batches.global_step

    @property
    def run(self):
        return self._lazy.run


class Acting:
    """What an integration does with the hub's commands (stop, checkpoint): its handler notes
    them as they arrive, and :meth:`act` carries them out at the framework's safe point (a
    step's end), with the framework's own ways to save and to stop."""

    def __init__(self, saves_later: bool = False):
        self.pending: list = []
        self._attached = None
        # ``save()`` only asks the framework to save after this step (the HF Trainer): the
        # checkpoint commands wait in ``saving`` until :meth:`saved` says it did.
        self.saves_later = saves_later
        self.saving: list = []

    def attach(self, run) -> None:
        if run is not None and self._attached is not run:
            self._attached = run
            run.on_command(self._note)

    def _note(self, cmd) -> None:
        if cmd.action in ("stop", "checkpoint"):
            self.pending.append(cmd)
            if cmd.action == "checkpoint":
                cmd.later()

    def act(self, run, save: Optional[Any], stop: Any, why_not: str = "") -> None:
        """``save()`` writes a checkpoint and returns its path (``None``: this framework has
        none configured, ``why_not`` says so); ``stop()`` asks the framework to stop."""
        if run is None:
            return
        run.poll_commands()
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        saved: Optional[str] = None
        for cmd in pending:
            if cmd.action == "checkpoint" or cmd.checkpoint:
                if saved is None:
                    try:
                        saved = save() if save is not None else None
                    except Exception as e:  # noqa: BLE001 - the answer says why
                        why = f"saving a checkpoint failed: {type(e).__name__}: {e}"
                        if cmd.action == "checkpoint":
                            cmd.decline(why)
                            continue
                        # A stop stops all the same: that is what was asked first.
                        cmd.saved = f"nothing ({why})"
                cmd.saved = saved
                if cmd.action == "checkpoint":
                    if saved is None:
                        cmd.decline(why_not or "no checkpoint is configured")
                    elif self.saves_later:
                        self.saving.append(cmd)
                    else:
                        cmd.done(f"saved {saved}")
            if cmd.action == "stop":
                stop()

    def saved(self) -> None:
        """The framework saved what ``save()`` asked for (``saves_later``): honoured."""
        for cmd in self.saving:
            cmd.done(f"saved {cmd.saved}")
        self.saving = []
