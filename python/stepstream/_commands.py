"""Commands for the training from the hub: stop, checkpoint, note (from the page, the API,
``stepstream stop`` or a rule).

A command arrives on the collector's socket and waits until the training takes it at a safe
point: ``run.should_stop``, ``run.poll_commands()`` or, once ``run.on_command(fn)`` is
registered, every ``run.log``. The integrations (MindSpore, MindFormers, HF ``Trainer``,
Lightning, Keras, Paddle) take them at each step's end and act as their framework can.

Each command is answered once: ``done(message)`` (honoured) or ``decline(why)``. A note is
honoured once the handlers saw it; a checkpoint no handler saved is declined (the page says
so); a stop is honoured when the run ends, which it then does as ``stopped``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional


class Command:
    """One command: ``action`` (``"stop"``, ``"checkpoint"`` or ``"note"``), ``checkpoint``
    (a stop that wants a checkpoint first), ``text`` (a note's), ``by``, ``reason``."""

    def __init__(self, native: Any, fields: dict):
        self._native = native
        self.id: int = fields["id"]
        self.action: str = fields["action"]
        self.checkpoint: bool = fields["checkpoint"]
        self.text: str = fields["text"]
        self.by: str = fields["by"]
        self.reason: str = fields["reason"]
        self.issued_at: float = fields["issued_at"]
        self.answered = False
        self.deferred = False
        #: What saving a checkpoint for it wrote (a path), for the answer.
        self.saved: Optional[str] = None

    def done(self, message: str = "") -> None:
        """Honoured (the checkpoint saved, the note shown); the first answer stands."""
        if not self.answered:
            self.answered = True
            self._native.command_done(self.id, True, message)

    def decline(self, why: str) -> None:
        """Could not be done, and why."""
        if not self.answered:
            self.answered = True
            self._native.command_done(self.id, False, why)

    def later(self) -> None:
        """A handler answers later (the framework saves after this step)."""
        self.deferred = True

    def describe(self) -> str:
        who = f" by {self.by}" if self.by else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.action}{who}{why}"

    def __repr__(self) -> str:
        return f"Command({self.id}, {self.describe()!r})"


class Commands:
    """The training side of a run's commands: the handlers, the stop taken, dispatch."""

    def __init__(self, native: Any):
        self._native = native
        self.handlers: List[Callable[[Command], Any]] = []
        self.stop: Optional[Command] = None

    def poll(self) -> List[Command]:
        """Takes the commands delivered since the last poll and hands each to the handlers."""
        if self._native is None or not self._native.has_commands:
            return []
        taken = [Command(self._native, f) for f in self._native.take_commands()]
        for cmd in taken:
            self.dispatch(cmd)
        return taken

    def dispatch(self, cmd: Command) -> None:
        if cmd.action == "stop" and self.stop is None:
            self.stop = cmd
        for handler in list(self.handlers):
            try:
                result = handler(cmd)
            except Exception as e:  # noqa: BLE001 - a handler's failure is the answer
                cmd.decline(f"{type(e).__name__}: {e}")
                if cmd is self.stop:
                    self.stop = None
                return
            if isinstance(result, str) and cmd.action in ("checkpoint", "stop"):
                cmd.saved = result
            if cmd.answered:
                return
        if cmd.deferred or cmd.answered:
            return
        if cmd.action == "note":
            cmd.done()
        elif cmd.action == "checkpoint":
            if cmd.saved is not None:
                cmd.done(f"saved {cmd.saved}")
            else:
                cmd.decline("this training saves no checkpoint on command (no handler saved one)")
        # A stop is honoured when the run ends (see Run.finish).

    def ending(self, step: Optional[int]) -> Optional[str]:
        """The run ends: answers the stop taken, if any; returns the stopped status's message."""
        cmd = self.stop
        if cmd is None:
            return None
        at = f" at step {step}" if step is not None else ""
        if cmd.saved:
            saved = f"; saved {cmd.saved}"
        elif cmd.checkpoint:
            saved = "; no checkpoint saved (nothing here saves one on command)"
        else:
            saved = ""
        cmd.done(f"stopped{at}{saved}")
        why = f": {cmd.reason}" if cmd.reason else ""
        return f"stopped by {cmd.by or 'a command'}{why}"
