"""Keras 3 (any backend): a callback for ``model.fit``.

    from stepstream.keras import StepStreamCallback
    model.fit(x, y, epochs=3, validation_data=(xv, yv), callbacks=[StepStreamCallback(project="cnn")])

Per step: ``loss`` and the compiled metrics, the ``learning_rate`` the step applies (the
optimizer's schedule at its iteration count, read before the step; held as a tensor, so
no device sync per step), ``epoch``, ``step_time``; at each epoch's end the validation
metrics (``val_*``) at the last step. The run's config is the model's and the optimizer's.
"""

from __future__ import annotations

from typing import Any, Optional

import keras

from ._events import Acting, Batches, FitLoop, Lazy, numeric

__all__ = ["StepStreamCallback"]


class StepStreamCallback(FitLoop, keras.callbacks.Callback):
    def __init__(self, checkpoint_dir: Optional[str] = None, **init_kwargs: Any):
        """``init_kwargs`` go to :func:`stepstream.init` (hub, project, name, token...).
        ``checkpoint_dir``: where a checkpoint or stop command from the hub saves the model
        (without it such a checkpoint is declined; a stop still stops)."""
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        self._acting = Acting()
        self._lazy = Lazy(init_kwargs.pop("framework", f"keras-{keras.backend.backend()}"), init_kwargs)
        self._batches = Batches(self._lazy, "learning_rate")

    def on_train_begin(self, logs=None):
        config: dict = {"fit": {k: v for k, v in (self.params or {}).items() if isinstance(v, (int, float, str, bool))}}
        try:
            config["optimizer"] = {
                k: v for k, v in self.model.optimizer.get_config().items() if isinstance(v, (int, float, str, bool))
            }
        except Exception:  # noqa: BLE001 - a config is a nicety, never a failure
            pass
        self._lazy.start(config=config, name=getattr(self.model, "name", None))

    def on_epoch_begin(self, epoch, logs=None):
        self._batches.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        opt = getattr(self.model, "optimizer", None)
        self._batches.begin(opt.learning_rate if opt is not None else None)

    def on_train_batch_end(self, batch, logs=None):
        self._batches.end(logs)
        # Commands from the hub, at the batch's end: save, then stop the fit loop.
        self._acting.attach(self._lazy.run)
        self._acting.act(self._lazy.run, self._save, self._stop, "no checkpoint_dir is configured")

    def _stop(self) -> None:
        self.model.stop_training = True

    def _save(self) -> Optional[str]:
        import os

        if self.checkpoint_dir is None:
            return None
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = os.path.join(self.checkpoint_dir, f"stepstream-command-{self.global_step}.keras")
        self.model.save(path)
        return path

    def on_epoch_end(self, epoch, logs=None):
        self._batches.evaluated({k: v for k, v in numeric(logs).items() if k.startswith("val_")})

    def on_train_end(self, logs=None):
        self._lazy.finish("finished")
