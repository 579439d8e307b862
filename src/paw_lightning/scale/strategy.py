"""FSDP2Strategy: Lightning's ``ModelParallelStrategy`` set up the way PaWModule uses it.

PaWModule applies FSDP2 (``fully_shard``) in ``configure_model`` over the mesh's
``data_parallel`` dimension, with no tensor parallelism. This subclass fixes the two settings
that then matter, so a YAML file needs neither arithmetic nor interpolation:
``data_parallel_size`` = ``trainer.num_nodes × trainer.devices`` with
``tensor_parallel_size`` = 1, and ``save_distributed_checkpoint=False`` (one file of gathered
trainable weights, :mod:`paw_lightning.scale.checkpointing`).

"""
from __future__ import annotations

from datetime import timedelta

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy

from paw_lightning.scale import checkpointing


class FSDP2Strategy(ModelParallelStrategy):
    """Pure FSDP2 over all processes, with world-size independent checkpoints.

    Args:
        process_group_backend: the ``torch.distributed`` backend; default gloo on CPU, NCCL on GPUs.
        timeout: timeout of collective operations.
    """

    def __init__(self, process_group_backend: str | None = None, timeout: timedelta | None = default_pg_timeout) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False, process_group_backend=process_group_backend, timeout=timeout)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # every rank of every node
        super().setup_environment()

    def lightning_module_state_dict(self) -> dict:
        """The gathered trainable weights only (a collective: every rank calls it)."""
        return checkpointing.trainable_state_dict(self.lightning_module)
