"""PyTorch, in a plain training loop: the global grad norm on the device, the applied lr.

    import stepstream, stepstream.torch as sst
    run = stepstream.init(project="mlp", framework="pytorch")
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        norm = sst.grad_norm(model)          # a 0-d tensor on the device: no sync here
        lr = sst.lr(optimizer)               # the lr this optimizer.step() applies
        optimizer.step(); optimizer.zero_grad(); scheduler.step()
        run.log({"loss": loss, "grad_norm": norm, "lr": lr}, step=step)

``run.log`` holds tensors (CPU or CUDA) and converts them every ``defer_every`` records in
one host copy per device: no device sync per step.

Which layer diverged: ``sst.watch(model, run, every=100)`` logs every layer's gradient and
weight norms (``grad_norm/<layer>``, ``weight_norm/<layer>``; the web app draws each family
as a layer x step heatmap) and, with ``histograms=True``, their distributions
(``grad/<layer>``, ``weight/<layer>``), every ``every``-th backward pass, computed on the
device in one pass per family.
"""

from __future__ import annotations

from typing import Any, Iterable, Union

import torch

__all__ = ["grad_norm", "lr", "watch", "Watch"]


def grad_norm(model_or_params: Union[torch.nn.Module, Iterable[Any]], norm_type: float = 2.0) -> torch.Tensor:
    """The global norm of the gradients, as ``clip_grad_norm_`` computes it, on the device:
    one fused ``foreach`` reduction per device and dtype, then the norm of those norms.
    Returns a 0-d tensor (``log`` accepts it without a sync); call it before ``zero_grad``."""
    params = model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params
    grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
    if not grads:
        return torch.zeros(())
    groups: dict = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g.detach())
    first = grads[0].device
    norms = []
    for (device, _dtype), gs in groups.items():
        norms.extend(n.to(first) for n in torch._foreach_norm(gs, norm_type))
    return torch.linalg.vector_norm(torch.stack(norms).float(), norm_type)


def lr(optimizer: torch.optim.Optimizer, group: int = 0) -> Any:
    """The learning rate ``optimizer.step()`` applies next (read it before the scheduler
    steps): a float, or the group's lr tensor for ``capturable`` optimizers (no sync)."""
    value = optimizer.param_groups[group]["lr"]
    return value.detach() if isinstance(value, torch.Tensor) else float(value)


class Watch:
    """What :func:`watch` returns: ``remove()`` stops watching."""

    def __init__(self, model: torch.nn.Module, run: Any, every: int, histograms: bool, bins: int):
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        self.run, self.every, self.histograms, self.bins = run, every, histograms, bins
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # A layer is the module that owns the parameter (`encoder.0.linear`).
        layers: dict = {}
        for i, (name, _p) in enumerate(self.params):
            layers.setdefault(name.rsplit(".", 1)[0] if "." in name else name, []).append(i)
        self.layers = list(layers.items())
        self.backwards = 0
        self.seen = 0
        self.armed = False
        self.handles = []
        hook = getattr(torch.Tensor, "register_post_accumulate_grad_hook", None)
        if hook is None:
            raise RuntimeError("stepstream.torch.watch needs PyTorch 2.1 or newer")
        for _name, p in self.params:
            self.handles.append(p.register_post_accumulate_grad_hook(self._accumulated))

    def _accumulated(self, _param: torch.Tensor) -> None:
        # Every parameter's grad is in after its hook ran once in this backward pass.
        if self.seen == 0:
            self.backwards += 1
            self.armed = self.backwards % self.every == 0 or self.backwards == 1
        self.seen += 1
        if self.seen == len(self.params):
            self.seen = 0
            if self.armed:
                self._log()

    def _norms(self, tensors: list) -> torch.Tensor:
        # One fused reduction per device and dtype, then per layer: sqrt of the summed squares.
        per = [None] * len(tensors)
        groups: dict = {}
        for i, t in enumerate(tensors):
            groups.setdefault((t.device, t.dtype), []).append(i)
        first = tensors[0].device
        for _key, idx in groups.items():
            for i, n in zip(idx, torch._foreach_norm([tensors[i] for i in idx])):
                per[i] = n.to(first, torch.float32)
        squares = torch.stack(per) ** 2
        return torch.stack([squares[idx].sum() for _layer, idx in self.layers]).sqrt()

    def _log(self) -> None:
        from . import Histogram

        grads = [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for _n, p in self.params]
        weights = [p.detach() for _n, p in self.params]
        g, w = self._norms(grads), self._norms(weights)
        record: dict = {}
        for i, (layer, idx) in enumerate(self.layers):
            record[f"grad_norm/{layer}"] = g[i]
            record[f"weight_norm/{layer}"] = w[i]
            if self.histograms:
                record[f"grad/{layer}"] = Histogram(torch.cat([grads[j].reshape(-1) for j in idx]), self.bins)
                record[f"weight/{layer}"] = Histogram(torch.cat([weights[j].reshape(-1) for j in idx]), self.bins)
        # At the step being trained: the one after the run's last logged step (which stays
        # the step a `log` without one uses).
        step = self.run.next_step
        self.run.log(record, step=step)
        self.run.next_step = step

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def watch(model: torch.nn.Module, run: Any = None, every: int = 100, histograms: bool = False, bins: int = 64) -> Watch:
    """Logs every layer's gradient and weight norms (and, with ``histograms``, their
    distributions) every ``every``-th backward pass and on the first, all computed on the
    device (no host sync: read with the run's next batch of records). ``run`` defaults to
    the last run ``stepstream.init`` started in this process."""
    if run is None:
        from . import current_run

        run = current_run()
    if run is None:
        raise RuntimeError("stepstream.torch.watch: start a run first (stepstream.init), or pass run=")
    return Watch(model, run, every, histograms, bins)
