"""The pieces of data parallelism across processes that need no second process: the job
read from the launchers' environments, shards, the host's option checks, the trainer's
reduction over processes, and the replica group's packing and diagnosis over a fake
store and fake collectives (the real ones run under the launcher in
tests/e2e/test_distributed.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import paddle_ipu.distributed as ipu_dist  # noqa: E402
from paddle_ipu._util import job as jobs  # noqa: E402
from paddle_ipu.backends import support  # noqa: E402
from paddle_ipu.backends.base import SessionConfig  # noqa: E402
from paddle_ipu.backends.host import replica_group as rg  # noqa: E402
from paddle_ipu.backends.host.gradients import build_gradient_program  # noqa: E402
from paddle_ipu.backends.host.trainer import HostTrainer, stack_micro_batches  # noqa: E402
from paddle_ipu.errors import (  # noqa: E402
    DistributedError,
    FeedError,
    NotSupportedError,
    OptionError,
)

_LAUNCHERS = ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_LOCAL_RANK",
              "PADDLE_LOCAL_SIZE", "PADDLE_NNODES", "POPDIST_NUM_TOTAL_REPLICAS",
              "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET")  # fmt: skip


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _LAUNCHERS:
        monkeypatch.delenv(name, raising=False)


def _paddle_job(monkeypatch: pytest.MonkeyPatch, rank: int, count: int, **more: str) -> None:
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", str(count))
    monkeypatch.setenv("PADDLE_TRAINER_ID", str(rank))
    for name, value in more.items():
        monkeypatch.setenv(name, value)


# -- the job ------------------------------------------------------------------------


def test_a_process_started_alone_is_a_job_of_one() -> None:
    job = ipu_dist.job()
    assert (job.launcher, job.index, job.count, job.is_first) == ("", 0, 1, True)
    ipu_dist.barrier()  # nothing to wait for
    ipu_dist.check_same(b"anything", "data")


def test_paddle_launchers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _paddle_job(monkeypatch, 3, 4, PADDLE_LOCAL_RANK="1", PADDLE_LOCAL_SIZE="2",
                PADDLE_NNODES="2")  # fmt: skip
    job = ipu_dist.job()
    assert job == jobs.Job(jobs.PADDLE, 3, 4, 1, 2, 2)
    assert (job.total_replicas(2), job.replica_offset(2), job.is_first) == (8, 6, False)
    assert "instance 3 of 4" in job.describe()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PADDLE_TRAINERS_NUM": "two", "PADDLE_TRAINER_ID": "0"},
         "PADDLE_TRAINERS_NUM: expected an integer >= 1, received 'two'"),
        ({"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "2"},
         "PADDLE_TRAINER_ID: expected a rank below PADDLE_TRAINERS_NUM=2, received 2"),
        ({"PADDLE_TRAINERS_NUM": "2"}, "PADDLE_TRAINER_ID is not set"),
        ({"POPDIST_NUM_TOTAL_REPLICAS": "0"},
         "POPDIST_NUM_TOTAL_REPLICAS: expected an integer >= 1, received '0'"),
    ],
)  # fmt: skip
def test_a_broken_launcher_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(OptionError, match=message):
        ipu_dist.job()


def test_shard_is_this_instances_block(monkeypatch: pytest.MonkeyPatch) -> None:
    _paddle_job(monkeypatch, 1, 2)
    x = np.arange(16).reshape(8, 2)
    mine = ipu_dist.shard(x)
    assert mine.tolist() == x[4:].tolist() and np.shares_memory(mine, x)
    assert ipu_dist.shard(x.T, axis=1).tolist() == x[4:].T.tolist()
    with pytest.raises(FeedError, match=r"'x': 7 rows along axis 0 .* multiple of 2, received 7"):
        ipu_dist.shard(np.zeros((7, 2)), name="x")
    with pytest.raises(FeedError, match="'y': a scalar"):
        ipu_dist.shard(np.float32(1), name="y")


def test_under_poprun_barrier_and_check_say_what_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "4")
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "2")
    with pytest.raises(NotSupportedError, match="mpi4py"):
        ipu_dist.barrier()
    with pytest.raises(NotSupportedError, match="Paddle's launcher"):
        ipu_dist.check_same(b"", "data")


# -- the host's option checks ---------------------------------------------------------


def test_the_host_honours_enable_distribution() -> None:
    host = support("host")
    for name in ("enable_distribution", "global_replication_factor", "global_replica_offset",
                 "enable_distributed_replicated_graphs"):  # fmt: skip
        assert host.status(name) == "honoured", name
        assert host.note(name)


def _config(**options: Any) -> SessionConfig:
    return SessionConfig(
        replication_factor=2, is_training=False, options=options, explicit=frozenset(options)
    )


def test_without_a_launcher_the_session_says_how_to_launch() -> None:
    assert rg.for_session(_config()) is None
    with pytest.raises(NotSupportedError, match=r"python -m paddle\.distributed\.launch"):
        rg.for_session(_config(enable_distribution=True))
    with pytest.raises(NotSupportedError, match=r"global_replication_factor describe .* set "
                       "enable_distribution too"):  # fmt: skip
        rg.for_session(_config(global_replication_factor=4))


def test_the_2x_options_describing_the_job_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _paddle_job(monkeypatch, 1, 3)
    ok = _config(enable_distribution=True, global_replication_factor=6, global_replica_offset=2,
                 enable_distributed_replicated_graphs=True)  # fmt: skip
    assert rg.for_session(ok) is None  # inference: the replicas share nothing
    with pytest.raises(OptionError, match=r"global_replication_factor is 4, but this job has 3 "
                       r"process\(es\) x 2 local replica\(s\): expected 6"):  # fmt: skip
        rg.for_session(_config(enable_distribution=True, global_replication_factor=4))
    with pytest.raises(OptionError, match=r"global_replica_offset is 0, .* expected 2 on rank 1"):
        rg.for_session(_config(enable_distribution=True, global_replica_offset=0))


# -- the trainer's reduction over processes ---------------------------------------------


class _OtherProcess:
    """A replica group of two whose other rank's gradient sums are known in advance."""

    size = 2

    def __init__(self, other: list[np.ndarray]) -> None:
        self.other = other
        self.calls: list[str] = []

    def all_reduce_sum(self, arrays: list[np.ndarray], what: str) -> list[np.ndarray]:
        self.calls.append(what)
        return [a + b for a, b in zip(arrays, self.other)]


def _trainer_program() -> tuple[Any, Any, Any]:
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        out = paddle.static.nn.fc(paddle.tanh(paddle.static.nn.fc(x, 8)), 1)
        loss = paddle.mean((out - y) ** 2)
        paddle.optimizer.Adam(0.01).minimize(loss)
    return main, startup, loss


@pytest.fixture
def _scope() -> Iterator[None]:
    paddle.enable_static()
    with paddle.static.scope_guard(paddle.static.Scope()), paddle.utils.unique_name.guard():
        yield


@pytest.mark.usefixtures("_scope")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_replicas_in_two_processes_update_as_two_local_replicas(reduction: str) -> None:
    main, startup, loss = _trainer_program()
    paddle.static.Executor(paddle.CPUPlace()).run(startup)
    gp = build_gradient_program(main, loss)
    rng = np.random.default_rng(0)
    mine, theirs = (
        {"x": rng.standard_normal((3, 4), dtype=np.float32),
         "y": rng.standard_normal((3, 1), dtype=np.float32)}
        for _ in range(2)
    )  # fmt: skip

    def trainer(**kw: Any) -> HostTrainer:
        t = HostTrainer(gp, gradient_reduction=reduction, **kw)
        t.load_scope(paddle.static.global_scope())
        return t

    local = trainer(replication_factor=2)
    local.step(stack_micro_batches([mine, theirs], 1, 2))
    # the other process's sums: its own trainer, summing (not dividing) one micro-batch
    other_sums, _ = _sums(gp, theirs)
    group = _OtherProcess([other_sums[slot.name] for slot in gp.optimizer.params])
    split = trainer(processes=group)
    split.step(stack_micro_batches([mine], 1, 1))
    assert group.calls == ["the gradient all-reduce of training step 1"]
    for name in local.optimizer.param_names + local.optimizer.state_var_names():
        a, b = local.read([name])[name], split.read([name])[name]
        assert a.tobytes() == b.tobytes(), name
    # an evaluation (no update follows) reduces nothing across processes
    split.compute_gradients(stack_micro_batches([mine], 1, 1), across_processes=False)
    assert len(group.calls) == 1


def _sums(gp: Any, batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Any]:
    t = HostTrainer(gp, gradient_reduction="sum")
    t.load_scope(paddle.static.global_scope())
    return t.compute_gradients(stack_micro_batches([batch], 1, 1))


# -- the replica group, over a fake store and fake collectives ------------------------


class _FakeStore:
    """Counters by key; the heartbeats of the ranks in ``alive`` move at every read."""

    def __init__(self, alive: set[int] = frozenset(), gone: bool = False) -> None:  # type: ignore[assignment]
        self.values: dict[str, int] = {}
        self.alive = set(alive)
        self.gone = gone

    def add(self, key: str, amount: int = 0) -> int:
        if self.gone:
            raise rg._StoreGone("Broken pipe")
        if key.startswith("hb/") and int(key[3:]) in self.alive:
            amount += 1
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]


class _FakeOps:
    def __init__(self, effect: Any) -> None:
        self.effect = effect

    def all_reduce_sum(self, tensor: np.ndarray) -> None:
        self.effect(tensor)

    def broadcast(self, tensor: np.ndarray, src: int) -> None:
        self.effect(tensor)


def _group(rank: int, size: int, store: _FakeStore, effect: Any = None) -> rg.ReplicaGroup:
    group = rg.ReplicaGroup.__new__(rg.ReplicaGroup)
    group.job = jobs.Job(jobs.PADDLE, rank, size)
    group.rank, group.size, group.collectives, group._barriers = rank, size, 0, 0
    group.seconds = 0.0
    group._flat, group._flat_tensor, group._heartbeat = None, None, None
    group._store = store  # type: ignore[assignment]
    group._ops = _FakeOps(effect)
    return group


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rg, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(rg, "STALE_S", 0.05)
    monkeypatch.setattr(rg.paddle_dist, "tensor_over", lambda array: array)


def test_all_reduce_packs_one_buffer_and_reuses_it() -> None:
    group = _group(0, 2, _FakeStore(), effect=lambda t: np.multiply(t, 2, out=t))
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, dtype=np.float32)
    first = group.all_reduce_sum([a, b], "x")
    assert [r.tolist() for r in first] == [(a * 2).tolist(), [2.0] * 4]
    buffer = group._flat
    group.all_reduce_sum([a, b], "x")
    assert group._flat is buffer and group.collectives == 2


def test_broadcast_gives_rank_0s_values_after_checking_the_layout() -> None:
    zero = {"w": np.full((2, 2), 7, np.float32), "n": np.array(3, np.int64)}
    mine = {"w": np.zeros((2, 2), np.float32), "n": np.array(0, np.int64)}
    packed = np.concatenate([zero[k].reshape(-1).view(np.uint8) for k in sorted(zero)])

    def effect(t: np.ndarray) -> None:
        if t.dtype == np.uint8:
            t[:] = packed  # what rank 0 sent
        else:
            t[:] = t.sum()  # both ranks' digests: the same layout

    out = _group(1, 2, _FakeStore(), effect).broadcast_from_first(mine, "the weights")
    assert out["w"].tolist() == zero["w"].tolist() and int(out["n"]) == 3


def test_different_data_names_the_ranks_that_differ() -> None:
    def effect(t: np.ndarray) -> None:
        t[:] = [11, 22, 11]  # rank 1 differs from rank 0

    group = _group(2, 3, _FakeStore(), effect)
    with pytest.raises(DistributedError, match=r"rank\(s\) 1 hold other values") as info:
        group.check_agreement(b"data", "the parameters")
    assert info.value.ranks == (1,)


def _fail(message: str) -> Any:
    def effect(_: Any) -> None:
        raise RuntimeError(message)

    return effect


LOST = "[pair.cc:584] TIMEOUT self_rank = 0 pair_rank = {} peer_str = [127.0.0.1]:1"


def test_a_closed_connection_names_its_peer_at_once() -> None:
    store = _FakeStore()
    group = _group(0, 2, store, _fail(LOST.format(1)))
    with pytest.raises(DistributedError, match="rank 1 closed its connection") as info:
        group.all_reduce_sum([np.ones(2, np.float32)], "the gradient all-reduce of step 3")
    assert info.value.ranks == (1,)
    assert "the gradient all-reduce of step 3 failed after" in str(info.value)
    assert store.values == {"failed/0": 2}  # its note: it blames rank 1


def test_with_more_ranks_the_note_of_the_peer_names_the_first_to_fail() -> None:
    store = _FakeStore()
    store.values["failed/1"] = 3  # rank 1 gave up because of rank 2
    group = _group(0, 3, store, _fail(LOST.format(1)))
    with pytest.raises(DistributedError, match="rank 2 failed first") as info:
        group.all_reduce_sum([np.ones(2, np.float32)], "it")
    assert info.value.ranks == (2,)


def test_a_hang_names_the_rank_whose_heartbeat_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    hang = _fail("[unbound_buffer.cc:80] TIMEOUT self_rank = none pair_rank = -1")
    monkeypatch.setattr(rg, "GLOO_TIMEOUT_S", 0.0)  # as if it came after gloo's timeout
    group = _group(0, 3, _FakeStore(alive={0, 1}), hang)
    with pytest.raises(DistributedError, match=r"rank\(s\) 2 stopped answering") as info:
        group.all_reduce_sum([np.ones(2, np.float32)], "it")
    assert info.value.ranks == (2,)


def test_a_hang_of_a_live_rank_names_the_rank_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    hang = _fail("[unbound_buffer.cc:80] TIMEOUT self_rank = none pair_rank = -1")
    monkeypatch.setattr(rg, "GLOO_TIMEOUT_S", 0.0)
    store = _FakeStore(alive={0, 1, 2})
    store.values.update({"at/1": 5, "at/2": 4})
    group = _group(0, 3, store, hang)
    group.collectives = 4  # the failing one is its 5th
    with pytest.raises(DistributedError, match=r"rank\(s\) 2 are alive but did not reach it"):
        group.all_reduce_sum([np.ones(2, np.float32)], "it")


def test_when_the_store_is_gone_rank_0_is_named() -> None:
    group = _group(1, 2, _FakeStore(gone=True), _fail("pair_rank = -1"))
    with pytest.raises(DistributedError, match="rank 0 does not answer") as info:
        group.all_reduce_sum([np.ones(2, np.float32)], "it")
    assert info.value.ranks == (0,)


def test_a_barrier_waits_for_every_rank() -> None:
    store = _FakeStore(alive={0, 1})
    store.values.update({"barrier/1": 1, "barrier/1/1": 1})  # rank 1 is there already
    _group(0, 2, store).barrier("the start")
    assert store.values["barrier/1"] == 2


def test_a_barrier_names_a_missing_rank_that_stopped() -> None:
    store = _FakeStore(alive={0})
    store.values["hb/1"] = 7  # it had joined: its heartbeat counted, then stopped
    with pytest.raises(DistributedError, match=r"rank\(s\) 1 stopped answering .* at the start"):
        _group(0, 2, store).barrier("the start")


def test_a_barrier_names_the_live_ranks_missing_at_the_timeout() -> None:
    # rank 1 is alive, or has not joined yet (no heartbeat: still compiling): a barrier
    # waits for it as long as its timeout
    store = _FakeStore(alive={0, 2})
    store.values.update({"barrier/1": 1, "barrier/1/2": 1})
    with pytest.raises(DistributedError, match=r"rank\(s\) 1 did not reach the start within "
                       r"0.2 s \(PADDLE_IPU_BARRIER_TIMEOUT\)") as info:  # fmt: skip
        _group(0, 3, store).barrier("the start", timeout=0.2)
    assert info.value.ranks == (1,)


def test_the_barrier_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rg.barrier_timeout() == rg.BARRIER_TIMEOUT_S
    monkeypatch.setenv("PADDLE_IPU_BARRIER_TIMEOUT", "12.5")
    assert rg.barrier_timeout() == 12.5
    monkeypatch.setenv("PADDLE_IPU_BARRIER_TIMEOUT", "soon")
    with pytest.raises(OptionError, match="expected a number of seconds > 0, received 'soon'"):
        rg.barrier_timeout()


def test_the_launchers_selected_ipu_is_the_processs_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from paddle_ipu import device
    from paddle_ipu.errors import DeviceError

    monkeypatch.delenv("FLAGS_selected_ipus", raising=False)
    assert device.selected_device() == 0  # no launcher, or one that does not see the ipu
    monkeypatch.setenv("FLAGS_selected_ipus", "1")
    assert device.selected_device() == 1
    monkeypatch.setenv("FLAGS_selected_ipus", "ipu:1")
    with pytest.raises(DeviceError, match=r"FLAGS_selected_ipus: expected .*received 'ipu:1'"):
        device.selected_device()
