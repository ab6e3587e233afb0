"""Stream training metrics to a stepstream hub, live.

    import stepstream
    with stepstream.init(hub="ws://127.0.0.1:7070", project="llama", name="lr-3e-4",
                         config={"lr": 3e-4}) as run:
        for step in range(steps):
            ...
            run.log({"loss": loss, "lr": lr}, step=step)

``run.log`` never blocks on the network: records go to a queue that a Rust thread batches,
sends, and resends after a hub outage. Each run is also archived locally as
``run_YYYYMMDD_HHMMSS_metrics.csv`` beside ``run_YYYYMMDD_HHMMSS_config.json`` (flushed every
``flush_every`` rows). Leaving the ``with`` block through an exception marks the run failed
with the exception's text; KeyboardInterrupt marks it killed.

Multi-card: rank and world size come from the launcher's environment (RANK_ID/RANK_SIZE for
MindSpore, RANK/WORLD_SIZE for torchrun, OMPI_COMM_WORLD_* for mpirun...). Only rank 0
reports unless ``all_ranks=True``, which makes every rank report as its own run, tagged with
its rank, so per-rank step times can be compared.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import time
from typing import Any, Mapping, Optional, Tuple

from ._stepstream import PROTOCOL_VERSION, __version__
from ._stepstream import Run as _NativeRun
from ._commands import Command, Commands
from ._samples import Histogram, Image, Table, Text

__all__ = ["init", "Run", "Command", "Text", "Table", "Histogram", "Image", "chart", "detect_rank", "__version__", "PROTOCOL_VERSION"]


def chart(run, metric="loss", **options):
    """The live chart of a run for a notebook cell; see :func:`stepstream.notebook.chart`."""
    from .notebook import chart as _chart

    return _chart(run, metric, **options)

_RANK_VARS = ("RANK_ID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_SIZE_VARS = ("RANK_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_LOCAL_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "DEVICE_ID", "SLURM_LOCALID")


def _first_int(env: Mapping[str, str], names: Tuple[str, ...]) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def detect_rank(env: Optional[Mapping[str, str]] = None) -> Tuple[int, int, int]:
    """(rank, world_size, local_rank) from the environment launchers set; (0, 1, 0) alone."""
    env = os.environ if env is None else env
    rank = _first_int(env, _RANK_VARS)
    size = _first_int(env, _SIZE_VARS)
    local = _first_int(env, _LOCAL_VARS)
    rank = 0 if rank is None else rank
    return rank, max(size or 1, rank + 1), 0 if local is None else local


_CURRENT: Optional["Run"] = None


def current_run() -> Optional["Run"]:
    """The run ``init`` started last in this process (``None`` before any)."""
    return _CURRENT


class Run:
    """A run being streamed. ``log`` is the native method itself: nothing in between."""

    def __init__(self, native: Optional[_NativeRun], rank: int, world_size: int):
        self._native = native
        self.rank = rank
        self.world_size = world_size
        self._ended = False
        self.hub: Optional[str] = None
        self._commands = Commands(native)
        if native is not None:
            self.log = native.log  # type: ignore[method-assign]
            self.flush = native.flush  # type: ignore[method-assign]
            atexit.register(self._at_exit)
            # An uncaught exception ends the run as failed, with its text and where it was
            # raised, not as finished. The traceback is printed first, so a captured console
            # holds it too.
            previous = sys.excepthook

            def hook(exc_type, exc, tb):
                previous(exc_type, exc, tb)
                if not self._ended:
                    status = "killed" if issubclass(exc_type, KeyboardInterrupt) else "failed"
                    self.finish(status, _failure(exc_type, exc, tb), timeout=5.0)

            sys.excepthook = hook
        self.started = time.time()

    # Replaced by the native methods when this rank reports.
    def log(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Records one step (a no-op on ranks that do not report)."""

    def flush(self) -> None:
        """Sends what is queued now."""

    @property
    def next_step(self) -> int:
        """The step ``log`` uses when given none: the last logged step + 1."""
        return self._native.next_step if self._native is not None else 0

    @next_step.setter
    def next_step(self, step: int) -> None:
        if self._native is not None:
            self._native.next_step = step

    @property
    def should_stop(self) -> bool:
        """Whether a stop command arrived (from the page, the API, ``stepstream stop`` or a
        rule): a plain loop checks it each step, saves if it wants, and breaks; the run then
        ends ``stopped``. Takes (and dispatches) any command waiting: one atomic load when
        none does."""
        self._commands.poll()
        return self._commands.stop is not None

    @property
    def stop_command(self) -> Optional[Command]:
        """The stop command taken, if any (who asked, why, whether a checkpoint first)."""
        return self._commands.stop

    def poll_commands(self) -> list:
        """Takes the commands delivered since the last call, hands each to the
        ``on_command`` handlers, and returns them."""
        return self._commands.poll()

    def alert(self, title: str, text: str = "", level: str = "warning") -> bool:
        """Raises an alert from the training's own code (an evaluation that regressed, data
        that looks wrong): stored with the run's alerts as ``user:TITLE`` and told on the hub's
        channels, like the hub's own rules. ``level``: info, warning or error. The same title
        is told at most once a minute. Never blocks."""
        if self._native is None:
            return False
        return self._native.alert(title, text, level)

    def on_command(self, handler) -> None:
        """Calls ``handler(command)`` for each command, on the training thread at the next
        ``log`` (or ``should_stop`` / ``poll_commands``). For a checkpoint (or a stop that wants
        one), return the path saved: the command is then honoured with it; raise to decline
        it. See :class:`stepstream.Command`."""
        if self._native is None:
            return
        first = not self._commands.handlers
        self._commands.handlers.append(handler)
        if first:
            native = self._native
            native_log = native.log
            commands = self._commands

            def log(*args, **kwargs):
                native_log(*args, **kwargs)
                if native.has_commands:
                    commands.poll()

            self.log = log  # type: ignore[method-assign]

    @property
    def active(self) -> bool:
        return self._native is not None and not self._ended

    @property
    def run_id(self) -> Optional[str]:
        return self._native.run_id if self._native is not None else None

    @property
    def metrics_csv(self) -> Optional[str]:
        return self._native.metrics_csv if self._native is not None else None

    @property
    def config_path(self) -> Optional[str]:
        return self._native.config_path if self._native is not None else None

    @property
    def connected(self) -> bool:
        return self._native is not None and self._native.connected

    def chart(self, metric="loss", **options):
        """This run's live chart in a notebook cell's output (``run.chart("loss")``): the
        hub's widget, from the hub this run streams to. A hub that guards reads needs a read
        token (``token=`` or ``$STEPSTREAM_READ_TOKEN``); the write token is never shown.
        Options: see :func:`stepstream.notebook.chart`."""
        from .notebook import chart as _chart

        if self.run_id is None:
            raise RuntimeError(f"rank {self.rank} does not report: chart the run of rank 0")
        options.setdefault("hub", self.hub)
        return _chart(self.run_id, metric, **options)

    def finish(self, status: str = "finished", message: Optional[str] = None, timeout: float = 30.0) -> dict:
        """Ends the run and waits up to ``timeout`` s for the hub to store everything."""
        if self._native is None or self._ended:
            return {"delivered": self._native is None}
        self._ended = True
        if status == "finished":
            # Ended after a stop command: the stop is honoured, and the run ends stopped.
            stopped = self._commands.ending(self._native.next_step - 1)
            if stopped is not None:
                status, message = "stopped", stopped
        return self._native.finish(status, message, timeout)

    def _at_exit(self) -> None:
        if not self._ended:
            self.finish("finished", timeout=5.0)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish("finished")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.finish("killed", "KeyboardInterrupt")
        else:
            # The traceback goes into the run's console now: Python prints it only once the
            # exception reaches the top, after the run (and its capture) ended.
            import traceback

            if self._native is not None and not self._ended:
                text = "".join(traceback.format_exception(exc_type, exc, tb))
                self._native.console_write(text, "stderr")
            self.finish("failed", _failure(exc_type, exc, tb))
        return False


def _failure(exc_type, exc, tb) -> str:
    """A failed run's status message: the exception and where it was raised."""
    text = f"{exc_type.__name__}: {exc}"
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        code = tb.tb_frame.f_code
        text += f" (at {os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name})"
    return text


def _jsonable(value: Any) -> Any:
    """A config as strict JSON: NaN and infinities (valid floats, invalid JSON) become the
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; keys become strings (so mixed key
    types still sort)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def init(
    hub: Optional[str] = None,
    project: str = "default",
    name: Optional[str] = None,
    config: Optional[Mapping[str, Any]] = None,
    *,
    token: Optional[str] = None,
    run_id: Optional[str] = None,
    archive_dir: Optional[str] = "stepstream-runs",
    flush_every: int = 10,
    all_ranks: bool = False,
    system_metrics: bool = True,
    system_interval: float = 5.0,
    defer_every: int = 10,
    memory_records: int = 500_000,
    spool_dir: Optional[str] = None,
    job: Optional[str] = None,
    framework: str = "",
    ca_file: Optional[str] = None,
    linger_ms: float = 40.0,
    console: Optional[bool] = None,
) -> Run:
    """Starts a run. Returns at once; connecting happens in the background.

    hub: ``ws://HOST:PORT`` (default ``$STEPSTREAM_HUB`` or ``ws://127.0.0.1:7070``).
    archive_dir: where the CSV and config are archived (None: no archive).
    defer_every: framework tensors handed to ``log`` are converted every N records, on a
        converter thread, so ``log`` never waits for a device; records keep their order.
    memory_records / spool_dir: while the hub is away, up to this many records wait in
        memory; the rest go to a spool file (default: ``<archive_dir>/.spool``, else the temp
        dir) and are sent, in order, when the hub is back.
    job: the distributed job this process is a rank of, the same for every rank of one
        launch (default: ``$STEPSTREAM_JOB``, else the launcher's job id: torchrun, Slurm,
        PBS, LSF, MindSpore's scheduler address). The web app shows a job as one row that
        expands into its ranks, and the straggler alert compares the ranks of a job.
    framework: what trains the model (``mindspore``, ``pytorch``...), shown in the run panel.
    ca_file: for a ``wss://`` hub with a private CA: its PEM certificate(s), trusted besides
        the public roots (default ``$STEPSTREAM_CA_FILE``).
    linger_ms: how long a record may wait for others to share its batch, at most (0 to
        60000; a full batch, ``run.flush()`` and ``finish`` send at once). The hub asks for
        less while it has room (none under 2,000 records a second), more as it fills up, to
        this limit; 0 sends each record as it is logged whatever the hub's load.
    console: capture this process's stdout and stderr (at the file-descriptor level, so C and
        C++ output too; the terminal still sees all of it) as the run's console. Default: on
        for the reporting rank(s), off inside a Jupyter kernel (which has its own capture).
    """
    rank, world_size, _local = detect_rank()
    if rank != 0 and not all_ranks:
        return Run(None, rank, world_size)
    hub = hub or os.environ.get("STEPSTREAM_HUB", "ws://127.0.0.1:7070")
    token = token or os.environ.get("STEPSTREAM_WRITE_TOKEN")
    run_id = run_id or os.environ.get("STEPSTREAM_RUN_ID")
    if name is None:
        script = os.path.splitext(os.path.basename(sys.argv[0] or "python"))[0] or "python"
        name = script
    tag = ""
    if all_ranks and world_size > 1:
        # The rank travels as data (rank, world size, job); the name stays the job's.
        tag = f"rank{rank}"
        if run_id:
            run_id = f"{run_id}-r{rank}"
    config_json = json.dumps(_jsonable(dict(config or {})), default=str, sort_keys=True, allow_nan=False)
    if console is None:
        console = "ipykernel" not in sys.modules
    if console:
        sys.stdout.flush()
        sys.stderr.flush()
    if spool_dir is None and archive_dir is not None:
        spool_dir = os.path.join(archive_dir, ".spool")
    native = _NativeRun(
        hub,
        project,
        name,
        config_json=config_json,
        run_id=run_id,
        token=token,
        rank=rank,
        world_size=world_size,
        archive_dir=archive_dir,
        archive_tag=tag,
        flush_every=flush_every,
        defer_every=defer_every,
        system_interval=system_interval if system_metrics else None,
        memory_records=memory_records,
        spool_dir=spool_dir,
        job=job,
        framework=framework,
        ca_file=ca_file or os.environ.get("STEPSTREAM_CA_FILE"),
        linger_ms=linger_ms,
        console=bool(console),
    )
    run = Run(native, rank, world_size)
    run.hub = hub
    global _CURRENT
    _CURRENT = run
    return run
