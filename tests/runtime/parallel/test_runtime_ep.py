"""Expert parallelism is exact: all-to-all dispatch over 4 ranks equals local experts in fp64."""

from __future__ import annotations

import json
import sys

import pytest

from helpers.paths import HELPERS

pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def test_all_to_all_experts_equal_local_experts_in_fp64(tmp_path):
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    out = tmp_path / "errors.json"
    worker = HELPERS / "ep_exactness_worker.py"
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=4, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                      rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1, start_method="spawn")
    elastic_launch(lc, sys.executable)(str(worker), str(out))
    errors = json.loads(out.read_text())
    assert len(errors) == 4
    for rank, err in enumerate(errors):
        assert err["out"] < 1e-12, (rank, err)
        assert any(k.startswith("experts.") for k in err) and any(k.startswith("router.") for k in err)
        for name, e in err.items():
            assert e < 1e-12, (rank, name, e)
