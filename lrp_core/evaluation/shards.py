"""Spreading one evaluation over several processes, and resuming an interrupted one.

A run is cut into *blocks*: consecutive samples, one batch (``--batch-size``)
each. Every model call of a protocol sees the samples of one block only, so a
sample is computed in exactly the same batch whatever the number of
processes: the per-sample values of a run with N processes are bit-identical
to those of a run with one (float round-off can depend on which samples share
a batch, so sharding by single samples would not guarantee that).

Block ``b`` belongs to rank ``b % world`` (strided, so slow and fast parts of
the data spread evenly). Each rank computes its blocks, rank 0 gathers them
all (``torch.distributed.gather_object``), puts them back in block order and
computes the summaries from the concatenated per-sample values, as a
one-process run does.

With a checkpoint folder (``<out>.partial/`` on the command line) every
finished block is saved as ``block-<b>.pkl`` beside a ``config.json`` of the
run; ``--resume`` loads the saved blocks instead of computing them again (any
number of processes may resume, as long as they see the folder). The folder is
removed once the results are written.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import InputError
from ..runtime.utils import progress_bar

INTERRUPTED = 3
"""Exit status of a run stopped on purpose by ``stop_after`` (a simulated interruption)."""

GROUP_TIMEOUT = timedelta(hours=12)
"""How long a rank waits for the others at the final gather (ranks may finish far apart)."""


def block_spans(n: int, size: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` of each block of ``size`` consecutive samples out of ``n``.

    Parameters
    ----------
    n : int
        Number of samples.
    size : int
        Samples per block (at least 1); the last block may be shorter.

    Returns
    -------
    list[tuple[int, int]]
        The spans, in order.

    Raises
    ------
    InputError
        If ``size`` is below 1.
    """
    if size < 1:
        raise InputError(f"batch_size must be >= 1, got {size}")
    return [(s, min(s + size, n)) for s in range(0, n, size)]


class Interrupted(SystemExit):
    """Raised after ``stop_after`` blocks: the process ends as if it had been killed."""

    def __init__(self) -> None:
        super().__init__(INTERRUPTED)


@dataclass
class Shard:
    """How this process takes part in a run.

    Attributes:
        rank, world: this process's rank and the number of processes (1, 0: alone).
        folder: checkpoint folder of finished blocks, or ``None`` (no checkpoints).
        resume: load the blocks already in ``folder`` instead of computing them.
        stop_after: developer option: compute at most this many blocks, wait for
            the other ranks, then raise :class:`Interrupted` (tests of resuming).
    """

    rank: int = 0
    world: int = 1
    folder: Optional[Path] = None
    resume: bool = False
    stop_after: Optional[int] = None

    @property
    def distributed(self) -> bool:
        return self.world > 1

    # ------------------------------------------------------------------ checkpoints
    def start(self, config: dict[str, Any]) -> None:
        """Prepare the checkpoint folder for a run.

        Without ``resume``, rank 0 empties the folder; with it, a folder written by another run (another model,
        n, batch size, ...) is refused.

        Parameters
        ----------
        config : dict[str, Any]
            The run's description (JSON values), stored in the folder.

        Raises
        ------
        InputError
            If resuming from a folder that holds a different run.
        """
        if self.folder is None:
            return
        cfg_path = self.folder / "config.json"
        if self.resume and cfg_path.exists():
            saved = json.loads(cfg_path.read_text(encoding="utf-8"))
            diff = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
            if diff:
                raise InputError(
                    f"--resume: {self.folder} holds a different run ("
                    + ", ".join(f"{k}: {saved.get(k)!r} there, {config.get(k)!r} now" for k in diff)
                    + "); rerun without --resume to start afresh"
                )
        elif self.rank == 0:
            if self.folder.exists():
                shutil.rmtree(self.folder)
            self.folder.mkdir(parents=True)
            cfg_path.write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        self.barrier()  # the others wait until rank 0 has (re)made the folder

    def finish(self) -> None:
        """Remove the checkpoint folder (rank 0, once the results are written)."""
        if self.folder is not None and self.rank == 0 and self.folder.exists():
            shutil.rmtree(self.folder)

    def _path(self, b: int) -> Path:
        assert self.folder is not None
        return self.folder / f"block-{b:06d}.pkl"

    def _load(self, b: int) -> Optional[Any]:
        """The saved values of block ``b`` when resuming and they exist, else ``None``."""
        if not (self.resume and self.folder is not None and self._path(b).exists()):
            return None
        with open(self._path(b), "rb") as f:  # our own files, written by _save
            return pickle.load(f)

    def _save(self, b: int, values: Any) -> None:
        """Write block ``b`` atomically: a killed process leaves no half-written block."""
        if self.folder is None:
            return
        tmp = self._path(b).with_suffix(f".tmp{self.rank}")
        with open(tmp, "wb") as f:
            pickle.dump(values, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self._path(b))

    # ------------------------------------------------------------------ the work
    def mine(self, n_blocks: int) -> list[int]:
        """The blocks this rank computes: those with ``b % world == rank``.

        Parameters
        ----------
        n_blocks : int
            Number of blocks in the run.

        Returns
        -------
        list[int]
            The block indices, ascending.
        """
        return list(range(self.rank, n_blocks, self.world))

    def map(
        self, n_blocks: int, compute: Callable[[int], Any], progress: bool = False, desc: str = "blocks"
    ) -> Optional[list[Any]]:
        """``[compute(b) for b in range(n_blocks)]``, spread over the ranks.

        Each rank computes its own blocks (or loads them, when resuming).

        Parameters
        ----------
        n_blocks : int
            Number of blocks.
        compute : Callable[[int], Any]
            A block's index to its values.
        progress : bool, optional
            Show a progress bar.
        desc : str, optional
            The progress bar's label.

        Returns
        -------
        Optional[list[Any]]
            On rank 0 the values of every block, in block order; ``None`` on the other ranks.
        """
        done: dict[int, Any] = {}
        loaded = computed = 0
        for b in progress_bar(self.mine(n_blocks), progress, desc=desc):
            values = self._load(b)
            if values is None:
                if self.stop_after is not None and computed >= self.stop_after:
                    break
                values = compute(b)
                self._save(b, values)
                computed += 1
            else:
                loaded += 1
            done[b] = values
        if loaded:
            print(
                f"rank {self.rank}: {loaded} block(s) resumed from {self.folder}, {computed} computed", file=sys.stderr
            )
        if self.stop_after is not None:
            self.barrier()
            raise Interrupted()
        parts = self.gather(done)
        if parts is None:
            return None
        merged: dict[int, Any] = {}
        for p in parts:
            merged.update(p)
        return [merged[b] for b in range(n_blocks)]

    # ------------------------------------------------------------------ torch.distributed
    def gather(self, obj: Any) -> Optional[list[Any]]:
        """Collect every rank's ``obj`` on rank 0.

        Parameters
        ----------
        obj : Any
            This rank's object (picklable).

        Returns
        -------
        Optional[list[Any]]
            On rank 0 the objects in rank order; ``None`` on the other ranks.
        """
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: Optional[list[Any]] = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def from_environment(device: str, backend: str = "auto") -> tuple[Shard, str]:
    """Join the process group torchrun has set up (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``).

    Without torchrun (``WORLD_SIZE`` unset or 1) nothing is initialised. On CUDA each rank takes the GPU
    ``LOCAL_RANK`` (modulo the GPUs present), and the gathered objects travel through it, as NCCL requires.

    Parameters
    ----------
    device : str
        Where the model runs (``"cpu"``, ``"cuda"``, ...).
    backend : str, optional
        ``"gloo"``, ``"nccl"`` or ``"auto"``: ``nccl`` when the model runs on CUDA, otherwise ``gloo``.

    Returns
    -------
    tuple[Shard, str]
        The :class:`Shard` (without folder) and the device this rank runs its model on.

    Raises
    ------
    InputError
        If CUDA is asked for but unavailable, or the backend is unknown.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Shard(), device
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    on_cuda = device.startswith("cuda")
    if on_cuda:
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: CUDA is not available on this machine")
        index = local % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    if backend == "auto":
        backend = "nccl" if on_cuda else "gloo"
    if backend not in ("gloo", "nccl"):
        raise InputError(f"unknown backend {backend!r}; choose auto, gloo or nccl")
    if not dist.is_initialized():
        # torch.distributed.nn.functional takes ``group.WORLD`` as a default argument when it is
        # first imported (model code imports it through torch._dynamo). Imported after the group
        # exists, those defaults hold the group for good: destroy_process_group then leaves its
        # gloo threads running into interpreter shutdown, where freeing a gathered tensor aborts
        # the process (SIGABRT, about 1 run in 50). Imported first, the defaults are None.
        import torch.distributed.nn  # noqa: F401

        dist.init_process_group(backend=backend, timeout=GROUP_TIMEOUT)
    return Shard(rank=rank, world=world), device


def leave() -> None:
    """Leave the process group (if this process joined one).

    Nothing else may hold the group: then destroying it here joins its worker
    threads while Python is still running (see :func:`from_environment`).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["Shard", "Interrupted", "INTERRUPTED", "block_spans", "from_environment", "leave"]
