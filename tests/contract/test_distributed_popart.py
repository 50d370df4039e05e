"""The data-parallel script of tests/e2e (distributed_job.py) unchanged on the popart
backend under poprun, over the PopART double and a popdist double.

poprun starts the instances with popdist's environment (``POPDIST_*``); the script
reads its place in the job with ``paddle_ipu.distributed`` (popdist's
``getInstanceIndex()``/``getNumInstances()``), feeds its shard and sets
``enable_distribution``.  The popart adapter takes its device from
``popdist.popart.getDevice(ipus_per_replica)`` and passes its SessionOptions through
``popdist.popart.configureSessionOptions`` after its own options; the step layout is read
back from the session (the local replicas).  The double of popdist sets what popdist
configures for PopART (distributed replicated graphs over all instances, this instance's
replicas and offset), as graphcore/popart's tests/integration/distributed_replicated_graph_test.py
sets them itself; popdist's own sources are not public."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

E2E = Path(__file__).resolve().parents[1] / "e2e"


def _popdist(index: int, instances: int, local: int, seen: list[Any]) -> ModuleType:
    popdist = types.ModuleType("popdist")
    popdist_popart = types.ModuleType("popdist.popart")
    popdist.isPopdistEnvSet = lambda: True  # type: ignore[attr-defined]
    popdist.getInstanceIndex = lambda: index  # type: ignore[attr-defined]
    popdist.getNumInstances = lambda: instances  # type: ignore[attr-defined]

    def configure(opts: Any) -> None:
        fields = ("enableReplicatedGraphs", "replicatedGraphCount", "accumulationFactor")
        seen.append(("configureSessionOptions", {f: getattr(opts, f) for f in fields}))
        opts.enableDistributedReplicatedGraphs = True
        opts.globalReplicationFactor = instances * local
        opts.globalReplicaOffset = index * local
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = local

    def get_device(ipus_per_replica: int) -> Any:
        seen.append(("getDevice", ipus_per_replica))
        popart = sys.modules["popart"]
        return popart.DeviceManager().createIpuModelDevice({"numIPUs": str(local)})

    popdist_popart.configureSessionOptions = configure  # type: ignore[attr-defined]
    popdist_popart.getDevice = get_device  # type: ignore[attr-defined]
    popdist.popart = popdist_popart  # type: ignore[attr-defined]
    return popdist


def _run_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: int, seen: list[Any]
) -> dict[str, Any]:
    instances, local = 2, 2
    monkeypatch.delenv("POPLAR_IPUMODEL", raising=False)  # popdist picks the device
    for name in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", str(instances * local))
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", str(local))
    monkeypatch.setenv("POPDIST_REPLICA_INDEX_OFFSET", str(index * local))
    popdist = _popdist(index, instances, local, seen)
    monkeypatch.setitem(sys.modules, "popdist", popdist)
    monkeypatch.setitem(sys.modules, "popdist.popart", popdist.popart)  # type: ignore[attr-defined]
    monkeypatch.syspath_prepend(str(E2E))
    monkeypatch.chdir(tmp_path)
    import distributed_job

    out = tmp_path / f"instance{index}"
    out.mkdir()
    cfg = out / "cfg.json"
    cfg.write_text(json.dumps({"out": str(out), "replicas": local, "steps": 6,
                               "mode": "save", "save_at": 3}))  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["distributed_job.py", str(cfg)])
    with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
        distributed_job.main()
    return json.loads((out / f"rank{index}.json").read_text())


@pytest.mark.parametrize("index", [0, 1])
def test_the_launcher_script_runs_unchanged_under_poprun(
    popart_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, index: int
) -> None:
    seen: list[Any] = []
    result = _run_script(tmp_path, monkeypatch, index, seen)
    # its place in the job came from popdist
    assert result["job"] == [index, 2]
    # the adapter: popdist configured the options (after the adapter's own: the local
    # replicas were already set), then popdist chose the device (1 IPU per replica)
    names = [call[0] for call in seen]
    assert names == ["configureSessionOptions", "getDevice"], names
    before = seen[0][1]
    assert before["replicatedGraphCount"] == 2 and before["enableReplicatedGraphs"]
    assert seen[1] == ("getDevice", 1)
    # one loss per local replica and step (PopART's layout, this instance's replicas)
    assert np.shape(result["losses"]) == (6, 2)
    # the checkpoint: instance 0 writes it, the others do not (no barrier under poprun)
    written = (tmp_path / f"instance{index}" / f"rank{index}" / "ckpt.safetensors").exists()
    assert written == (index == 0)


def test_under_poprun_the_shard_is_popdists_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    import paddle_ipu.distributed as ipu_dist

    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "8")
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "2")
    monkeypatch.setenv("POPDIST_REPLICA_INDEX_OFFSET", "6")
    monkeypatch.delitem(sys.modules, "popdist", raising=False)
    job = ipu_dist.job()  # without the module: poprun's uniform layout from the env
    assert (job.launcher, job.index, job.count, job.local_replicas) == ("poprun", 3, 4, 2)
    assert ipu_dist.shard(np.arange(8)).tolist() == [6, 7]
