"""Hugging Face ``Trainer`` (and PaddleFormers' ``Trainer``, which calls the same events).

    from stepstream.transformers import StepStreamCallback
    trainer = Trainer(model, args, ..., callbacks=[StepStreamCallback(project="llm")])

Streams, at each optimizer step: ``learning_rate`` as applied by that step (read from the
optimizer before it steps: the value ``Trainer`` logs is already the next step's),
``epoch``, ``step_time``, and with ``include_num_input_tokens_seen`` ``tokens_seen`` and
``tokens_per_sec``; at each log: ``loss``, ``grad_norm`` and whatever else ``Trainer`` logs;
evaluation metrics (``eval_*``) at the step they were computed. The run's config is the
``TrainingArguments`` and the model's config. Only the world's main process reports unless
``all_ranks=True``. The class needs nothing from ``transformers`` itself, so one callback
serves both trainers; events either adds later are ignored.
"""

from __future__ import annotations

from typing import Any, Optional

from ._events import Acting, Lazy, Throughput, numeric, scalar

__all__ = ["StepStreamCallback"]


def _to_dict(obj: Any) -> dict:
    for attr in ("to_dict", "to_diff_dict"):
        f = getattr(obj, attr, None)
        if callable(f):
            try:
                return dict(f())
            except Exception:  # noqa: BLE001 - a config that cannot serialise is skipped
                pass
    return {}


class StepStreamCallback:
    def __init__(self, *, watch: Optional[int] = None, watch_histograms: bool = False, **init_kwargs: Any):
        """``init_kwargs`` go to :func:`stepstream.init` (hub, project, name, token...).
        ``watch=N``: every layer's gradient and weight norms (and, with ``watch_histograms``,
        their histograms) every N optimizer steps, as ``stepstream.torch.watch`` logs them
        (a PyTorch model)."""
        self._watch = (watch, watch_histograms)
        self._watching = None
        self._lazy = Lazy(init_kwargs.pop("framework", "transformers"), init_kwargs)
        self._all_ranks = bool(init_kwargs.get("all_ranks", False))
        self._lr: Optional[Any] = None
        self._clock = Throughput()
        # The Trainer saves after this step's events (``on_save`` answers).
        self._acting = Acting(saves_later=True)

    def __getattr__(self, name: str):
        # Events this version does not know (on_optimizer_step, on_push_begin...): no-ops.
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def _reports(self, state) -> bool:
        return self._all_ranks or getattr(state, "is_world_process_zero", True)

    @property
    def run(self):
        return self._lazy.run

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self._reports(state):
            return
        config = {"training_args": _to_dict(args)}
        model_config = getattr(model, "config", None)
        if model_config is not None:
            config["model_config"] = _to_dict(model_config)
        run = self._lazy.start(config=config, name=getattr(args, "run_name", None))
        self._acting.attach(run)
        every, histograms = self._watch
        if every and model is not None and run is not None and self._watching is None:
            from .torch import watch

            self._watching = watch(model, run, every=every, histograms=histograms)

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        # The lr this step applies: the scheduler steps after the optimizer.
        if optimizer is not None and getattr(optimizer, "param_groups", None):
            self._lr = scalar(optimizer.param_groups[0].get("lr"))
        elif optimizer is not None and hasattr(optimizer, "get_lr"):  # Paddle
            self._lr = scalar(optimizer.get_lr())

    def on_step_end(self, args, state, control, **kwargs):
        if not self._reports(state):
            return
        values = self._clock.step(getattr(state, "num_input_tokens_seen", None) or None)
        if self._lr is not None:
            values["learning_rate"] = self._lr
        if state.epoch is not None:
            values["epoch"] = float(state.epoch)
        self._lazy.log(values, state.global_step)

        # Commands from the hub: the Trainer saves (``should_save``) right after this event,
        # then stops (``should_training_stop``); ``on_save`` tells where it saved.
        def save():
            control.should_save = True
            return f"{args.output_dir}/checkpoint-{state.global_step}"

        def stop():
            control.should_training_stop = True

        self._acting.act(self._lazy.run, save, stop)

    def on_save(self, args, state, control, **kwargs):
        # The checkpoint a command asked for is written now: honoured (a stop is honoured
        # when the run ends).
        self._acting.saved()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._reports(state):
            return
        # The logged learning_rate is the next step's; on_step_end sent the applied one.
        skip = ("learning_rate", "epoch", "total_flos") if self._lr is not None else ("total_flos",)
        self._lazy.log(numeric(logs, skip=skip), state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._lazy.finish("finished")
