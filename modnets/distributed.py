"""Data-parallel training under ``torchrun``, and a no-op everywhere else.

Every experiment CLI runs unchanged as ``torchrun --nproc_per_node=N -m modnets.experiments.X``:
:func:`setup` joins the process group that ``torchrun`` describes in the environment (NCCL on
CUDA, gloo on CPU), :func:`wrap_ddp` puts the model in ``DistributedDataParallel``, and each rank
trains on its shard of every *global* batch (:func:`shard`), so ``N`` processes with a global batch
``B`` take exactly the optimisation steps of one process with batch ``B`` (gradients are averaged
by DDP; each rank's loss is the mean over an equal shard). Only rank 0 logs, shows progress bars and
writes checkpoints (:func:`is_main`); metrics are summed across ranks with :func:`all_reduce_sum`.

Without ``torchrun`` (``WORLD_SIZE`` unset or 1) every function is a cheap no-op.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "setup",
    "cleanup",
    "is_distributed",
    "rank",
    "world_size",
    "is_main",
    "local_device",
    "wrap_ddp",
    "unwrap",
    "shard",
    "all_reduce_sum",
    "barrier",
]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that logs and writes files."""
    return rank() == 0


def local_device() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def setup() -> bool:
    """Join the process group described by ``torchrun``'s environment; returns whether we did."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_distributed():
        return is_distributed()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_device())
    dist.init_process_group(backend)
    return True


def cleanup() -> None:
    if is_distributed():
        dist.destroy_process_group()


def wrap_ddp(model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
    """``DistributedDataParallel(model)`` when distributed, else ``model``.

    ``find_unused_parameters`` is for models where some parameters get no gradient in a step
    (NFM's attention at a read that only the default slot can serve)."""
    if not is_distributed():
        return model
    device = next(model.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(
        model, device_ids=ids, find_unused_parameters=find_unused_parameters
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (for checkpoints and analysis)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def shard(indices: Tensor) -> Tensor:
    """This rank's share of a global batch of indices (rank ``r`` takes ``r, r + N, ...``).

    The global batch must split evenly, so every rank's mean loss has the same weight and DDP's
    gradient average equals the single-process gradient of the global batch.
    """
    n = world_size()
    if n == 1:
        return indices
    if len(indices) % n:
        raise ValueError(
            f"the global batch ({len(indices)}) must be divisible by the world size ({n})"
        )
    return indices[rank() :: n]


def all_reduce_sum(value: float | Tensor) -> float:
    """Sum a number over ranks (a plain float in a single process)."""
    if not is_distributed():
        return float(value)
    t = torch.as_tensor(value, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.to(local_device())
    dist.all_reduce(t)
    return float(t.item())


def barrier() -> None:
    if is_distributed():
        dist.barrier()
