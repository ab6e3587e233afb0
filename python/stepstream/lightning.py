"""PyTorch Lightning: a ``Logger``, alone or beside others.

    from stepstream.lightning import StepStreamLogger
    trainer = Trainer(logger=[StepStreamLogger(project="mnist"), CSVLogger("logs")])

``log_metrics`` streams whatever Lightning logs (``self.log(...)`` in the module, the
``LearningRateMonitor``'s lr...) at the step Lightning gives; ``log_hyperparams`` sets the
run's config (the first call starts the run with it); ``finalize(status)`` ends the run
as finished, failed or killed. Only global rank 0 reports, as with Lightning's own loggers.

Commands from the hub (stop, checkpoint) need a callback, since a logger sees no trainer:
``Trainer(logger=logger, callbacks=[StepStreamCommands(logger)])`` saves with
``trainer.save_checkpoint`` and stops with ``trainer.should_stop`` at a batch's end.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any, Mapping, Optional, Union

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
    from lightning.pytorch.utilities import rank_zero_only
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore
    from pytorch_lightning.loggers.logger import Logger, rank_zero_experiment  # type: ignore
    from pytorch_lightning.utilities import rank_zero_only  # type: ignore

from ._events import Acting, Lazy, numeric

__all__ = ["StepStreamLogger", "StepStreamCommands"]


def _plain(params: Union[Mapping[str, Any], Namespace, None]) -> dict:
    if params is None:
        return {}
    if isinstance(params, Namespace):
        params = vars(params)
    return dict(params)


class StepStreamLogger(Logger):
    def __init__(self, **init_kwargs: Any):
        """``init_kwargs`` go to :func:`stepstream.init` (hub, project, name, token...)."""
        super().__init__()
        self._lazy = Lazy(init_kwargs.pop("framework", "lightning"), init_kwargs)
        self._config: dict = dict(init_kwargs.get("config") or {})

    @property
    def name(self) -> str:
        return str(self._lazy.kwargs.get("project", "default"))

    @property
    def version(self) -> str:
        run = self._lazy.run
        return (run.run_id or "") if run is not None else ""

    @property
    @rank_zero_experiment
    def experiment(self):
        """What holds the :class:`stepstream.Run` (``.run``, once the first hyper-parameters
        or metrics arrive). Lightning touches this at setup, before ``log_hyperparams``:
        starting the run here would start it without its config."""
        return self._lazy

    @rank_zero_only
    def watch(self, model: Any, every: int = 100, histograms: bool = False):
        """Every layer's gradient and weight norms (and histograms) every ``every``
        backward passes (``stepstream.torch.watch``), as ``WandbLogger.watch`` does."""
        from .torch import watch

        return watch(model, self._lazy.start(config=self._config), every=every, histograms=histograms)

    @rank_zero_only
    def log_hyperparams(self, params: Union[Mapping[str, Any], Namespace], *args: Any, **kwargs: Any) -> None:
        self._config.update(_plain(params))
        self._lazy.start(config=self._config)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        run = self._lazy.start(config=self._config)
        values = numeric(metrics)
        if values:
            run.log(values, step=None if step is None else int(step))

    @rank_zero_only
    def save(self) -> None:
        if self._lazy.run is not None:
            self._lazy.run.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        status = {"success": "finished", "failed": "failed", "finished": "finished"}.get(status, "killed")
        self._lazy.finish(status, None if status == "finished" else f"lightning: {status}")


class StepStreamCommands(Callback):
    """Honours the hub's commands for the run ``logger`` streams, at each training batch's
    end: a checkpoint through ``trainer.save_checkpoint`` (into ``dirpath``, else the
    trainer's checkpoint callback's folder, else its root dir), a stop through
    ``trainer.should_stop`` (the run then ends ``stopped``)."""

    def __init__(self, logger: StepStreamLogger, dirpath: Optional[str] = None):
        super().__init__()
        self._logger = logger
        self._dirpath = dirpath
        self._acting = Acting()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        run = self._logger._lazy.run
        if run is None:
            return
        self._acting.attach(run)

        def stop():
            trainer.should_stop = True

        self._acting.act(run, lambda: self._save(trainer), stop)

    def _save(self, trainer) -> str:
        import os

        folder = self._dirpath or getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"stepstream-command-step{trainer.global_step}.ckpt")
        trainer.save_checkpoint(path)
        return path
