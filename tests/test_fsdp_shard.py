"""FSDP2 sharding (`shard_model`) on 2 CPU ranks with gloo matches the unsharded model.

The checks themselves live in `fsdp_worker.py`, launched here with torchrun.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # torchrun with 2 processes

WORKER = Path(__file__).with_name("fsdp_worker.py")


def test_fsdp2_two_cpu_ranks_match_unsharded(tiny_model_dir):
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(WORKER), str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for rank in (0, 1):
        assert f"rank {rank}: FSDP2 matches unsharded" in result.stdout
