"""MindSpore (and MindFormers) integration: one callback, one optional train cell.

    from stepstream.mindspore import StepStreamCallback, TrainOneStepWithGradNorm
    cell = TrainOneStepWithGradNorm(nn.WithLossCell(net, loss_fn), optimizer)
    model = Model(cell)                                       # net_outputs = (loss, grad_norm)
    model.train(epochs, dataset, callbacks=[StepStreamCallback(project="mlp", config=cfg)])
    # MindFormers: Trainer(..., callbacks=[StepStreamCallback(...)])

Per step the callback records ``loss``, the learning rate actually applied at that step,
``grad_norm`` (when the train cell returns it), ``step_time``, ``samples_per_sec``,
``tokens_per_sec`` (when ``seq_len`` is given), ``samples_seen`` and ``tokens_seen`` (the
running totals, the x axis on which runs of different batch sizes compare), ``perplexity`` (``perplexity=True``, for
language models), ``epoch``, ``loss_scale`` and ``overflow`` (loss-scale cells and
MindFormers' 4/5/7-tuples), ``data_wait`` (time between the previous step's end and this
step's start: the wait for the next batch), ``batch_size`` and ``empty_batch``.

Choices, from facts verified on MindSpore 2.10 (see the project's MINDSPORE.md):

* The learning rate: at step end ``optimizer.get_lr()`` already returns the *next* step's
  value, so the callback uses the schedule at ``global_step - 1`` for schedules, indexes a
  host copy of the table (read once) for per-step lists, and reads constants once.
* Device syncs: loss, grad norm, lr, overflow, loss scale and perplexity (``exp`` of the
  loss, on the device) are handed to ``run.log`` as tensors; the native layer converts them
  every ``defer_every`` steps, stacked into one host copy, so no step waits for the device.
  In PyNative the loss scale is the live Parameter: an asynchronous copy keeps the step's
  value.
* The lr costs nothing per step: the shipped train cells return the applied lr from the
  graph; with a plain ``Model(net, loss, opt)`` a ``LearningRateSchedule`` is evaluated on a
  vector of ``LR_CHUNK`` future steps in one call.
* Sink mode: with ``dataset_sink_mode=True`` and ``sink_size > 1`` on a device, MindSpore
  calls step end once per sink with only the sink's last step; the callback records that
  step (``cur_step_num``) and ``sink_size``. On CPU, sink mode silently runs per step.
* Gradient norm on the device in one reduction: use :class:`TrainOneStepWithGradNorm`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, Optional

import mindspore as ms
from mindspore import nn, ops
from mindspore.train import Callback

import stepstream
from stepstream._events import Acting

__all__ = [
    "StepStreamCallback",
    "TrainOneStepWithGradNorm",
    "TrainOneStepWithLossScaleGradNorm",
    "global_norm",
]

import numpy as _np

if int(_np.__version__.split(".")[0]) >= 2:
    # numpy >= 2 with MindSpore 2.10: the first eager op of a process fails once; take the
    # failure here rather than in a training step. (Not done on numpy 1: an eager op
    # initialises the runtime, after which the device can no longer be chosen.)
    try:
        (ms.Tensor([1], ms.int32) - 1).asnumpy()
    except SystemError:
        pass

_square_sum = ops.MultitypeFuncGraph("_stepstream_square_sum")


@_square_sum.register("Tensor")
def _square_sum_tensor(g):
    return ops.reduce_sum(ops.square(ops.cast(g, ms.float32)))


def global_norm(grads):
    """The global L2 norm of a tuple of gradients, computed in the graph."""
    return ops.sqrt(ops.addn(ops.HyperMap()(_square_sum, grads)))


_layer_norm = ops.MultitypeFuncGraph("_stepstream_layer_norm")


@_layer_norm.register("Tensor")
def _layer_norm_of(g):
    return ops.sqrt(ops.reduce_sum(ops.square(ops.cast(g, ms.float32))))


class TrainOneStepWithGradNorm(nn.TrainOneStepCell):
    """``nn.TrainOneStepCell`` that also returns the gradients' global norm and the learning
    rate this step applied: ``(loss, norm, lr)``, as MindFormers' train cell returns its lr.
    With ``layer_norms=True`` also each parameter's gradient norm, stacked into one vector
    in the order of ``cell.weights``: ``(loss, norm, lr, layer_norms)``, which the callback's
    ``watch`` logs as ``grad_norm/<parameter>``.

    The norms are reductions in the graph, after the gradient all-reduce (the norms of the
    averaged gradients), so no gradient is copied to the host. Use it as ``Model(cell)``.
    """

    def __init__(self, network, optimizer, sens=1.0, layer_norms=False):
        super().__init__(network, optimizer, sens)
        self.layer_norms = bool(layer_norms)
        self.hyper_map = ops.HyperMap()

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        norm = global_norm(grads)
        lr = self.optimizer.get_lr()  # before the update: the rate this step applies
        if self.layer_norms:
            layers = ops.stack(self.hyper_map(_layer_norm, grads))
            loss = ops.depend(loss, self.optimizer(grads))
            return loss, norm, lr, layers
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, norm, lr


_grad_unscale = ops.MultitypeFuncGraph("_stepstream_grad_unscale")


@_grad_unscale.register("Tensor", "Tensor")
def _grad_unscale_tensor(scale, grad):
    return grad * ops.cast(ops.reciprocal(scale), ops.dtype(grad))


_non_finite = ops.MultitypeFuncGraph("_stepstream_non_finite")


@_non_finite.register("Tensor")
def _non_finite_count(g):
    return ops.reduce_sum(ops.cast(ops.logical_not(ops.isfinite(g)), ms.float32))


class TrainOneStepWithLossScaleGradNorm(nn.TrainOneStepWithLossScaleCell):
    """The loss-scale train cell that also returns the learning rate it applied and the
    global norm of the unscaled gradients, in MindFormers' layout:
    ``(loss, overflow, loss_scale, lr, grad_norm)``.

    Overflow is detected with ``isfinite`` on the gradients (one reduction per gradient, on
    every backend, CPU included, where the NPU float-status path does not exist). A step that
    overflows is skipped and the scale manager lowers the scale, as in the base class.
    """

    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, filled)
        grads = self.hyper_map(ops.partial(_grad_unscale, scaling_sens), grads)
        grads = self.grad_reducer(grads)
        cond = ops.addn(self.hyper_map(_non_finite, grads)) > 0
        overflow = self.process_loss_scale(cond)
        norm = global_norm(grads)
        lr = self.optimizer.get_lr()  # before the update: the rate this step applies
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, scaling_sens, lr, norm


#: Future steps of a ``LearningRateSchedule`` evaluated in one call (a schedule cell is
#: elementwise in its step): one graph call per this many steps instead of one per step.
LR_CHUNK = 1024


def _scalar(t) -> float:
    if isinstance(t, ms.Tensor):
        t = t.asnumpy()
    try:
        return float(t.reshape(-1)[0])
    except AttributeError:
        return float(t)


class StepStreamCallback(Callback):
    """Streams each training step to a stepstream hub (see the module docs).

    run: an existing ``stepstream.Run``; otherwise one is started at train begin with
        ``stepstream.init(**init_kwargs)`` (hub, project, name, config, ...), and finished at
        train end.
    seq_len: tokens per sample, for ``tokens_per_sec``.
    perplexity: also record ``exp(loss)`` (language models).
    samples: ``samples(step, run_context) -> {key: stepstream.Text(...) | Table | Image |
        Histogram}``, called at step 1 and every ``samples_every`` steps: what the model
        generates now, logged beside the step's values.
    watch: every N steps (and at step 1) log each parameter's weight norm as
        ``weight_norm/<parameter>`` (one stacked reduction on the device, read with the next
        batch of records, never a sync) and, with ``TrainOneStepWithGradNorm(...,
        layer_norms=True)``, its gradient norm as ``grad_norm/<parameter>``: the page draws
        them as per-layer heatmaps. 0: off.
    lr_every: for a schedule that cannot be evaluated on a vector of steps: read it every
        N steps (a read costs ~0.5 ms in graph mode and ~5 ms in PyNative). Schedules that
        can (the usual ones: elementwise in the step) are evaluated ``LR_CHUNK`` steps at a
        time, so the lr is exact at every step at a negligible cost. The shipped train cells
        return the applied lr themselves: nothing is read then.
    """

    def __init__(
        self,
        run: Optional["stepstream.Run"] = None,
        *,
        seq_len: Optional[int] = None,
        perplexity: bool = False,
        lr_every: int = 1,
        samples: Optional[Callable[[int, Any], Mapping[str, Any]]] = None,
        samples_every: int = 100,
        watch: int = 0,
        checkpoint_dir: Optional[str] = None,
        **init_kwargs: Any,
    ):
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        self._acting = Acting()
        self.run = run
        self._own_run = run is None
        self._init_kwargs = init_kwargs
        self._init_kwargs.setdefault("framework", "mindspore")
        self.seq_len = seq_len
        self.perplexity = perplexity
        self.lr_every = max(1, int(lr_every))
        self.samples = samples
        self.samples_every = max(1, int(samples_every))
        self.watch = max(0, int(watch))
        self._params: Optional[list] = None
        self._lr_reader = None
        self._batch: Optional[int] = None
        # Samples trained on so far, and the step they were counted to (a sink of several
        # steps ends once: its steps all count).
        self._samples_seen = 0.0
        self._counted_to: Optional[int] = None
        # A schedule's values for global steps [_chunk_start, _chunk_start + len(_chunk)).
        self._chunk = None
        self._chunk_start = 0
        self._vector_ok: Optional[bool] = None
        self._last_end: Optional[float] = None
        self._step_begin: Optional[float] = None

    # -- helpers ------------------------------------------------------------------------
    def _optimizer(self, p):
        opt = p.get("optimizer") if hasattr(p, "get") else getattr(p, "optimizer", None)
        if opt is None:
            train = getattr(p, "train_network", None)
            opt = getattr(train, "optimizer", None)
        return opt

    def _learning_rate(self, p, step: int):
        # What the lr comes from is decided once, at the first step; each step after is
        # one call of the chosen reader.
        if self._lr_reader is None:
            self._lr_reader = self._choose_lr_reader(p, step)
        return self._lr_reader(step)

    def _choose_lr_reader(self, p, step: int):
        opt = self._optimizer(p)
        if opt is None or getattr(opt, "is_group_lr", False):
            return lambda step: None
        lr = opt.learning_rate
        if not getattr(opt, "dynamic_lr", False):
            constant = _scalar(lr)
            return lambda step: constant
        table = getattr(lr, "learning_rate", None)
        if isinstance(table, ms.Parameter):  # per-step list: index a host copy of it
            host = table.asnumpy().reshape(-1).astype(_np.float64).tolist()
            last = len(host) - 1
            return lambda step: host[min(step - 1, last)]
        # A LearningRateSchedule: the value the optimizer used for this step, at global
        # step g = the optimizer's count before it (read once: a resumed run starts above 0).
        offset = int(_scalar(opt.global_step)) - step

        def scheduled(step):
            g = step + offset - 1
            chunk = self._chunk
            if chunk is not None and self._chunk_start <= g < self._chunk_start + len(chunk):
                return chunk[g - self._chunk_start]
            if self._vector_ok is not False:
                value = self._from_chunk(lr, g)
                if value is not None:
                    return value
            if step % self.lr_every and step != 1:
                return None
            return lr(ms.Tensor(g, ms.int32))

        return scheduled

    def _from_chunk(self, schedule, g: int) -> Optional[float]:
        """``schedule(g)`` from a table evaluated ``LR_CHUNK`` steps at a time.

        The schedule's ``construct`` runs eagerly (~6 ms per chunk on a CPU): calling the
        cell would compile a graph per input shape (~0.3 s each), which a short run feels."""
        if self._chunk is None or not (self._chunk_start <= g < self._chunk_start + len(self._chunk)):
            steps = ms.Tensor(_np.arange(g, g + LR_CHUNK, dtype=_np.int32))
            table = None
            for evaluate in (getattr(schedule, "construct", None), schedule):
                if evaluate is None:
                    continue
                try:
                    table = _np.asarray(evaluate(steps).asnumpy(), dtype=_np.float64).reshape(-1)
                    if self._vector_ok is None:
                        # Elementwise? The first value must be what a scalar step gives.
                        one = _scalar(evaluate(ms.Tensor(g, ms.int32)))
                        self._vector_ok = len(table) == LR_CHUNK and math.isclose(
                            float(table[0]), one, rel_tol=1e-6, abs_tol=1e-12)
                    break
                except Exception:  # noqa: BLE001 - try the next way, then give up
                    table = None
            if table is None:
                self._vector_ok = False
            if not self._vector_ok:
                return None
            self._chunk, self._chunk_start = table.tolist(), g
        return self._chunk[g - self._chunk_start]

    def _config(self, p) -> Mapping[str, Any]:
        cfg = dict(self._init_kwargs.pop("config", None) or {})
        for key in ("epoch_num", "batch_num", "device_number", "parallel_mode", "dataset_sink_mode"):
            v = p.get(key) if hasattr(p, "get") else None
            if v is not None:
                cfg.setdefault(f"mindspore.{key}", v)
        opt = self._optimizer(p)
        if opt is not None:
            cfg.setdefault("mindspore.optimizer", type(opt).__name__)
        return cfg

    # -- hooks ----------------------------------------------------------------------------
    def on_train_begin(self, run_context):
        p = run_context.original_args()
        if self.run is None:
            self.run = stepstream.init(config=self._config(p), **self._init_kwargs)
        self._acting.attach(self.run)
        self._last_end = time.perf_counter()

    def on_train_step_begin(self, run_context):
        self._step_begin = time.perf_counter()

    def on_train_step_end(self, run_context):
        now = time.perf_counter()
        p = run_context.original_args()
        out = p.net_outputs
        step = int(p.cur_step_num)
        rec: dict = {"epoch": int(p.cur_epoch_num)}
        loss = None
        # Every tensor goes to `log` as a tensor: held and converted with the others every
        # `defer_every` steps, never a device sync per step.
        layers = None
        if isinstance(out, (tuple, list)):
            loss = out[0]
            scaled = len(out) >= 3 and isinstance(out[1], ms.Tensor) and out[1].dtype == ms.bool_
            if not scaled and len(out) in (2, 3, 4) and isinstance(out[1], ms.Tensor):
                rec["grad_norm"] = out[1]  # (loss, norm[, lr[, layers]]): TrainOneStepWithGradNorm
                if len(out) >= 3 and isinstance(out[2], ms.Tensor):
                    rec["lr"] = out[2]
                if len(out) == 4 and isinstance(out[3], ms.Tensor):
                    layers = out[3]
            elif scaled:  # (loss, overflow, scale[, lr[, global_norm[, local_norm, size]]])
                rec["overflow"] = out[1]
                scale = out[2]
                if isinstance(scale, ms.Parameter):
                    # PyNative hands back the live Parameter, which the next step changes:
                    # an (asynchronous) copy keeps this step's value.
                    scale = scale + 0
                rec["loss_scale"] = scale
                if len(out) >= 4 and out[3] is not None:
                    rec["lr"] = out[3]
                if len(out) >= 5 and out[4] is not None:
                    rec["grad_norm"] = out[4]
        else:
            loss = out
        if loss is not None:
            rec["loss"] = loss
            if self.perplexity and isinstance(loss, ms.Tensor):
                rec["perplexity"] = ops.exp(ops.cast(loss, ms.float32))  # on the device
            elif self.perplexity:
                value = float(loss)
                rec["perplexity"] = math.exp(value) if value < 700 else float("inf")
        if "lr" not in rec:
            lr = self._learning_rate(p, step)
            if lr is not None:
                rec["lr"] = lr
        began = self._step_begin if self._step_begin is not None else self._last_end
        if began is not None:
            step_time = max(now - began, 1e-9)
            rec["step_time"] = step_time
            if self._last_end is not None and self._step_begin is not None:
                rec["data_wait"] = max(self._step_begin - self._last_end, 0.0)
            batch = self._batch_size(p, step)
            if batch is not None:
                rec["batch_size"] = batch
                rec["empty_batch"] = 1.0 if batch == 0 else 0.0
                rec["samples_per_sec"] = batch / step_time
                since = step - self._counted_to if self._counted_to is not None else step
                self._samples_seen += batch * max(since, 0)
                self._counted_to = step
                rec["samples_seen"] = self._samples_seen
                if self.seq_len:
                    rec["tokens_per_sec"] = batch * self.seq_len / step_time
                    rec["tokens_seen"] = self._samples_seen * self.seq_len
        if self.watch and (step == 1 or step % self.watch == 0):
            self._watch(p, rec, layers)
        sink = p.get("sink_size") if hasattr(p, "get") else None
        if sink:
            rec["sink_size"] = sink
        if self.samples is not None and (step == 1 or step % self.samples_every == 0):
            # What the training code generates (a text, a table, an image, a histogram),
            # logged with the step's values; a failing generator never stops training.
            try:
                rec.update(self.samples(step, run_context) or {})
            except Exception as e:  # noqa: BLE001
                import warnings

                warnings.warn(f"stepstream: the samples callback failed at step {step}: {e!r}")
        self.run.log(rec, step=step)
        # Commands from the hub, at this safe point: save where a ModelCheckpoint (or
        # ``checkpoint_dir``) says, stop through the run context.
        self._acting.act(
            self.run,
            lambda: self._save(p, step),
            run_context.request_stop,
            "no ModelCheckpoint callback (or checkpoint_dir) is configured",
        )
        self._last_end = time.perf_counter()

    def _save(self, p, step: int) -> Optional[str]:
        import os

        import mindspore as ms

        folder, prefix = self.checkpoint_dir, "stepstream"
        for cb in getattr(p, "list_callback", None) or []:
            if isinstance(cb, ms.train.ModelCheckpoint):
                folder = folder or getattr(cb, "_directory", None)
                named = getattr(cb, "_prefix", None)
                prefix = named if isinstance(named, str) and named else prefix
        if folder is None:
            return None
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{prefix}-command-{step}.ckpt")
        ms.save_checkpoint(p.train_network, path)
        return path

    def _watched(self, p) -> list:
        # The train cell's weights, in the order of its gradients (and of `layer_norms`).
        if self._params is None:
            train = getattr(p, "train_network", None) or getattr(p, "network", None)
            weights = getattr(train, "weights", None)
            if weights is None and train is not None:
                weights = train.trainable_params()
            self._params = list(weights or [])
        return self._params

    def _watch(self, p, rec: dict, layers) -> None:
        """Per-parameter weight norms (and the cell's gradient norms) into `rec`, as tensors:
        read with the next batch of records, off the training thread."""
        params = self._watched(p)
        if not params:
            return
        names = [q.name for q in params]
        if layers is not None and tuple(layers.shape) == (len(names),):
            for i, name in enumerate(names):
                rec[f"grad_norm/{name}"] = layers[i]
        norms = ops.stack([_layer_norm_of(q) for q in params])
        for i, name in enumerate(names):
            rec[f"weight_norm/{name}"] = norms[i]

    def _batch_size(self, p, step: int) -> Optional[int]:
        # A batch's shape costs ~10 us to read; only an epoch's first and last batches can
        # differ from the ones before them (a short last batch), so read just those.
        per_epoch = p.get("batch_num") if hasattr(p, "get") else None
        if per_epoch and self._batch is not None:
            in_epoch = (step - 1) % per_epoch + 1
            if 1 < in_epoch < per_epoch:
                return self._batch
        element = p.get("train_dataset_element") if hasattr(p, "get") else None
        self._batch = None
        if element:
            first = element[0] if isinstance(element, (list, tuple)) else element
            shape = getattr(first, "shape", None)
            if shape:
                self._batch = int(shape[0])
        return self._batch

    def on_train_end(self, run_context):
        if self.run is not None:
            self.run.flush()
            if self._own_run:
                self.run.finish("finished")
