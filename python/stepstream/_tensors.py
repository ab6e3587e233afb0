"""Held tensors to floats, many at once: the native layer calls :func:`to_floats` every
``defer_every`` records with every tensor it held, in order.

Converting a device tensor forces a device sync. One per tensor would put a sync in every
step; here the tensors of one framework and one device are stacked on the device (async)
and copied to the host once, so a batch of steps costs one sync per device.
"""

from __future__ import annotations

from typing import Any, List, Optional

# Conversions done, by kind, for tests and profiling: ``host_copies`` counts device-to-host
# copies (syncs on an accelerator), ``tensors`` the tensors they carried.
stats = {"host_copies": 0, "tensors": 0}


def _first(x: Any) -> Optional[float]:
    item = getattr(x, "item", None)
    if item is not None:
        # A one-element tensor's own read: ~1 us for MindSpore's, against ~15 for asnumpy.
        try:
            v = float(item())
            stats["host_copies"] += 1
            return v
        except Exception:  # noqa: BLE001 - more than one element: the first, below
            pass
    try:
        if hasattr(x, "asnumpy"):
            x = x.asnumpy()
        elif hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        stats["host_copies"] += 1
        return float(x.reshape(-1)[0]) if hasattr(x, "reshape") else float(x)
    except Exception:  # noqa: BLE001 - one bad value must not stop training
        return None


def _torch_group(ts: List[Any]) -> List[Optional[float]]:
    import torch

    flat = torch.stack([t.detach().reshape(-1)[0].to(torch.float64) for t in ts])
    stats["host_copies"] += 1
    return flat.cpu().tolist()


def _paddle_group(ts: List[Any]) -> List[Optional[float]]:
    import paddle

    flat = paddle.stack([t.detach().reshape([-1])[0].astype("float64") for t in ts])
    stats["host_copies"] += 1
    return [float(v) for v in flat.numpy().reshape(-1)]


_MINDSPORE_ON_CPU: Optional[bool] = None


def _mindspore_on_cpu() -> bool:
    # Read once: MindSpore's device cannot change once tensors exist (and the read costs
    # ~10 us, more than reading ten tensors on a CPU).
    global _MINDSPORE_ON_CPU
    if _MINDSPORE_ON_CPU is None:
        import mindspore as ms

        _MINDSPORE_ON_CPU = ms.get_context("device_target") == "CPU"
    return _MINDSPORE_ON_CPU


def _mindspore_group(ts: List[Any]) -> List[Optional[float]]:
    from mindspore import ops

    flat = ops.stack([ops.reshape(t, (-1,))[0].astype("float32") for t in ts])
    stats["host_copies"] += 1
    return [float(v) for v in flat.asnumpy().reshape(-1)]


_GROUPS = {"torch": _torch_group, "paddle": _paddle_group, "mindspore": _mindspore_group}


def _framework(x: Any) -> str:
    return type(x).__module__.split(".", 1)[0]


def _device(x: Any) -> str:
    d = getattr(x, "device", None)
    if d is None:
        d = getattr(x, "place", None)
    return str(d)


def to_floats(objs: List[Any]) -> List[Optional[float]]:
    """The first element of each object as a float (``None`` where it cannot be read)."""
    stats["tensors"] += len(objs)
    out: List[Optional[float]] = [None] * len(objs)
    by_type: dict = {}
    for i, x in enumerate(objs):
        by_type.setdefault(type(x), []).append(i)
    groups: dict = {}
    for cls, idx in by_type.items():
        fw = cls.__module__.split(".", 1)[0]
        if fw not in _GROUPS or len(objs) == 1 or (fw == "mindspore" and _mindspore_on_cpu()):
            # Nothing to sync on a CPU, and each eager op costs more than a host read.
            for i in idx:
                out[i] = _first(objs[i])
            continue
        for i in idx:
            groups.setdefault((fw, _device(objs[i])), []).append(i)
    for (fw, _dev), idx in groups.items():
        try:
            values = _GROUPS[fw]([objs[i] for i in idx])
        except Exception:  # noqa: BLE001 - mixed shapes or dtypes: one by one
            values = [_first(objs[i]) for i in idx]
        for i, v in zip(idx, values):
            out[i] = v
    return out


def to_lists(packs: List[Any]) -> List[Optional[List[float]]]:
    """Each held pack (a 1-D tensor or array computed where its tensor lives: a histogram's
    range, non-finite counts and bins) as a list of floats; torch packs of one device and
    length are stacked and copied to the host at once (one sync per device)."""
    out: List[Optional[List[float]]] = [None] * len(packs)
    groups: dict = {}
    for i, p in enumerate(packs):
        if _framework(p) == "torch":
            groups.setdefault((_device(p), tuple(p.shape)), []).append(i)
        else:
            try:
                out[i] = [float(v) for v in (p.tolist() if hasattr(p, "tolist") else p)]
            except Exception:  # noqa: BLE001 - one bad pack must not stop training
                out[i] = None
    for _key, idx in groups.items():
        import torch

        try:
            rows = torch.stack([packs[i].detach().to(torch.float64) for i in idx]).cpu().tolist()
            stats["host_copies"] += 1
        except Exception:  # noqa: BLE001
            rows = [None] * len(idx)
        for i, row in zip(idx, rows):
            out[i] = row
    return out
