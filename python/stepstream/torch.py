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
"""

from __future__ import annotations

from typing import Any, Iterable, Union

import torch

__all__ = ["grad_norm", "lr"]


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
