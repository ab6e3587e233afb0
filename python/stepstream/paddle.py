"""PaddlePaddle's high-level API: a callback for ``paddle.Model.fit``.

    from stepstream.paddle import StepStreamCallback
    model.fit(train_data, eval_data, epochs=2, callbacks=[StepStreamCallback(project="ocr")])

Per step: ``loss`` (and the model's metrics), the ``lr`` the step applied (read from the
optimizer before the step: hapi's ``LRScheduler`` callback steps the schedule after it),
``epoch``, ``step_time``, ``batch_size``; evaluation results as ``eval_*`` at the step they
were computed. Only rank 0 reports unless ``all_ranks=True``.
"""

from __future__ import annotations

from typing import Any, Optional

import paddle

from ._events import Acting, Batches, FitLoop, Lazy, numeric

__all__ = ["StepStreamCallback"]


class StepStreamCallback(FitLoop, paddle.callbacks.Callback):
    def __init__(self, checkpoint_dir: Optional[str] = None, **init_kwargs: Any):
        """``init_kwargs`` go to :func:`stepstream.init` (hub, project, name, token...).
        ``checkpoint_dir``: where a checkpoint or stop command from the hub saves the model
        (without it such a checkpoint is declined; a stop still stops)."""
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        self._acting = Acting()
        self._lazy = Lazy(init_kwargs.pop("framework", "paddle"), init_kwargs)
        self._batches = Batches(self._lazy, "lr")

    def on_train_begin(self, logs=None):
        params = {k: v for k, v in (self.params or {}).items() if isinstance(v, (int, float, str, bool, list))}
        self._lazy.start(config={"fit": params})

    def on_epoch_begin(self, epoch, logs=None):
        self._batches.epoch = epoch

    def on_train_batch_begin(self, step, logs=None):
        opt = getattr(self.model, "_optimizer", None)
        self._batches.begin(opt.get_lr() if opt is not None else None)

    def on_train_batch_end(self, step, logs=None):
        self._batches.end(logs)
        # Commands from the hub, at the batch's end: save, then stop the fit loop.
        self._acting.attach(self._lazy.run)
        self._acting.act(self._lazy.run, self._save, self._stop, "no checkpoint_dir is configured")

    def _stop(self) -> None:
        # hapi looks at ``stop_training`` only between epochs; one iteration left makes it
        # leave the epoch after this batch (its own ``num_iters`` countdown) and then stop.
        self.model.stop_training = True
        self.model.num_iters = 1

    def _save(self) -> Optional[str]:
        import os

        if self.checkpoint_dir is None:
            return None
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = os.path.join(self.checkpoint_dir, f"stepstream-command-{self.global_step}")
        self.model.save(path)  # writes path.pdparams and path.pdopt
        return path

    def on_eval_end(self, logs=None):
        self._batches.evaluated({f"eval_{k}": v for k, v in numeric(logs, skip=("batch_size",)).items()})

    def on_train_end(self, logs=None):
        self._lazy.finish("finished")
