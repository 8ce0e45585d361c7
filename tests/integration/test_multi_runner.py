"""StarPO with two remote env runners on a real local Ray: group split and merge, one weight
broadcast through the object store, policy versions, and an env runner killed mid-rollout."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from ragen_rllib.trajectory.schema import Col

pytestmark = pytest.mark.integration

GROUPS, GROUP_SIZE, ITERATIONS = 5, 2, 2  # 5 groups over 2 runners: chunks of 3 and 2


def _build(tiny_model_dir: Path, tmp_path: Path, run_name: str) -> Any:
    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import PRESETS

    params = PRESETS["starpo"](model=str(tiny_model_dir), engine="hf", env="bandit", env_groups=GROUPS,
                               group_size=GROUP_SIZE, response_length=6, enable_think=False, adv_estimator="grpo",
                               test_freq=0, ppo_mini_batch_size=GROUPS * GROUP_SIZE, actor_lr=1e-4)
    return (StarPOConfig().training(starpo=params)
            .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
            .storage(run_dir=str(tmp_path), run_name=run_name).debugging(seed=0).build_algo())


def _runner_infos(algo: Any) -> dict[int, dict[str, Any]]:
    infos = algo.env_runner_group.foreach_env_runner(lambda r: r.policy_info(), local_env_runner=False)
    return {i["worker_index"]: i for i in infos}


def _wait_until_restarted(group: Any, deadline_s: float = 180.0) -> list[int]:
    """Probe the unhealthy runners until Ray has restarted one (the restart is asynchronous)."""
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        restored = group.probe_unhealthy_env_runners(timeout_seconds=5.0)
        if restored:
            return restored
        time.sleep(1.0)
    raise AssertionError(f"no env runner came back within {deadline_s} s")


def _check_store(tmp_path: Path, run_name: str) -> Any:
    from ragen_rllib.trajectory import TrajectoryStore

    table = TrajectoryStore(tmp_path, run_name).read()
    assert table.num_rows == ITERATIONS * GROUPS * GROUP_SIZE
    keys = list(zip(table[Col.ITERATION].to_pylist(), table[Col.GROUP_ID].to_pylist(),
                    table[Col.SAMPLE_IDX].to_pylist(), strict=False))
    assert len(set(keys)) == len(keys), "a (group_id, sample_idx) was written twice in one iteration"
    for it in range(ITERATIONS):
        rows = table.filter(table[Col.ITERATION].to_numpy() == it)
        assert set(rows[Col.POLICY_VERSION].to_pylist()) == {it}
        assert sorted(set(rows[Col.GROUP_ID].to_pylist())) == [it * GROUPS + g for g in range(GROUPS)]
    return table


@pytest.fixture(scope="module")
def clean_run(tiny_model_dir, ray_local, tmp_path_factory) -> dict[str, Any]:
    """Two iterations with two runners and no fault, recording each sample call's per-runner
    outputs and every ray.put of a weight dict."""
    import ray

    tmp_path = tmp_path_factory.mktemp("clean")
    algo = _build(tiny_model_dir, tmp_path, "clean")
    chunk_outputs: list[list[dict]] = []
    weight_puts: list[str] = []
    sample_chunks, real_put = algo.runners.sample_chunks, ray.put

    def recording_sample_chunks(chunks, kw, *args):
        outs, resampled = sample_chunks(chunks, kw, *args)
        chunk_outputs.append(outs)
        return outs, resampled

    def counting_put(value, *args, **kwargs):
        ref = real_put(value, *args, **kwargs)
        if isinstance(value, dict) and any(str(k).endswith(".weight") for k in value):
            weight_puts.append(ref.hex())
        return ref

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(algo.runners, "sample_chunks", recording_sample_chunks)
        mp.setattr(ray, "put", counting_put)
        try:
            results = [algo.train() for _ in range(ITERATIONS)]
            infos = _runner_infos(algo)
        finally:
            algo.stop()
    return {"results": results, "infos": infos, "chunk_outputs": chunk_outputs, "weight_puts": weight_puts,
            "table": _check_store(tmp_path, "clean")}


def test_two_runners_split_groups_and_share_one_weight_broadcast(clean_run) -> None:
    results, infos, weight_puts = clean_run["results"], clean_run["infos"], clean_run["weight_puts"]
    assert results[-1]["policy_version"] == float(ITERATIONS)
    assert results[-1]["faults/env_runner_restarts"] == 0.0 and results[-1]["faults/resampled_groups"] == 0.0
    # Both runners hold the algorithm's version, loaded from the same object-store object: the
    # weights went through one ray.put per sync, not one per runner.
    assert sorted(infos) == [1, 2]
    assert {i["policy_version"] for i in infos.values()} == {ITERATIONS}
    assert len(weight_puts) == ITERATIONS
    assert {i["weights_object_id"] for i in infos.values()} == {weight_puts[-1]}
    # Each sample call split the groups over both runners; each group came from exactly one.
    assert len(clean_run["chunk_outputs"]) == ITERATIONS
    for it, outs in enumerate(clean_run["chunk_outputs"]):
        assert sorted(o["worker_index"] for o in outs) == [1, 2]
        assert sorted(len(o["rows"]) for o in outs) == [2 * GROUP_SIZE, 3 * GROUP_SIZE]
        per_runner = [{r[Col.GROUP_ID] for r in o["rows"]} for o in outs]
        assert not per_runner[0] & per_runner[1]
        assert per_runner[0] | per_runner[1] == {it * GROUPS + g for g in range(GROUPS)}
        assert {o["policy_version"] for o in outs} == {it}


def test_runner_killed_mid_rollout_is_restarted_and_its_groups_resampled_once(clean_run, tiny_model_dir, ray_local,
                                                                              tmp_path, monkeypatch) -> None:
    from ragen_rllib.env_runners.runner_pool import sample_chunk_on_runner

    algo = _build(tiny_model_dir, tmp_path, "fault")
    group = algo.env_runner_group
    foreach = group.foreach_env_runner
    killed: list[dict[str, Any]] = []

    def crash_after_first_generate(runner, **kw):
        # Runs inside the env runner: its process gets SIGKILL right after the first batched
        # generate call of this rollout, i.e. with episodes in flight.
        import os
        import signal

        from ragen_rllib.env_runners.runner_pool import sample_chunk_on_runner

        engine = runner.engine
        generate = engine.generate

        def generate_then_die(*args, **kwargs):
            generate(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        engine.generate = generate_then_die
        return sample_chunk_on_runner(runner, **kw)

    def foreach_with_one_crash(func, **kwargs):
        # In iteration 0, the first sample chunk sent to a runner kills that runner's process.
        is_sample = isinstance(func, list) and all(
            isinstance(f, functools.partial) and f.func is sample_chunk_on_runner for f in func)
        if is_sample and algo.iteration == 0 and not killed:
            target = kwargs["remote_worker_ids"][0]
            killed.append({"worker": target, "groups": func[0].keywords["groups"],
                           "pid": _runner_infos(algo)[target]["pid"]})
            func = [functools.partial(crash_after_first_generate, **func[0].keywords)] + func[1:]
        return foreach(func, **kwargs)

    chunk_outputs: list[list[dict]] = []
    sample_chunks = algo.runners.sample_chunks

    def recording_sample_chunks(chunks, kw, *args):
        outs, resampled = sample_chunks(chunks, kw, *args)
        chunk_outputs.append(outs)
        return outs, resampled

    monkeypatch.setattr(group, "foreach_env_runner", foreach_with_one_crash)
    monkeypatch.setattr(algo.runners, "sample_chunks", recording_sample_chunks)
    try:
        results = [algo.train()]  # iteration 0: a runner dies, its chunk is re-sampled on the other
        restored = _wait_until_restarted(group)  # Ray restarts the actor (a new process, ~10-30 s here)
        results.append(algo.train())  # iteration 1: the restarted runner gets the weights, then samples
        infos = _runner_infos(algo)
        # An exception inside sample (here: an unknown env) is a bug, not a fault: raised once with
        # the runner's traceback, the runner is not killed, nothing is retried.
        with pytest.raises(RuntimeError, match="no_such_env"):
            algo._sample([(10**6, 1), (10**6 + 1, 2)], GROUP_SIZE, "no_such_env", 1.0, iteration=9, sampling_seed=0)
        after_bug = _runner_infos(algo)
    finally:
        algo.stop()

    assert {w: i["pid"] for w, i in after_bug.items()} == {w: i["pid"] for w, i in infos.items()}

    assert len(killed) == 1
    assert restored == [killed[0]["worker"]]
    assert results[0]["faults/resampled_groups"] == float(len(killed[0]["groups"]))
    survivor = 3 - killed[0]["worker"]  # runners are 1 and 2: both chunks of iteration 0 came from the survivor
    assert [o["worker_index"] for o in chunk_outputs[0]] == [survivor, survivor]
    r = results[-1]
    assert r["faults/env_runner_restarts"] == 1.0
    assert r["policy_version"] == float(ITERATIONS)
    # The killed runner came back as a new process, was loaded with the current weights and sampled.
    restarted = infos[killed[0]["worker"]]
    assert restarted["pid"] != killed[0]["pid"]
    assert {i["policy_version"] for i in infos.values()} == {ITERATIONS}
    assert sorted(o["worker_index"] for o in chunk_outputs[1]) == [1, 2]
    assert {o["policy_version"] for o in chunk_outputs[1]} == {1}
    table = _check_store(tmp_path, "fault")
    # Same groups, same seeds: the re-sampled chunk gives exactly the rows of the run without a fault.
    clean = clean_run["table"]
    for col in (Col.GROUP_ID, Col.SAMPLE_IDX, Col.INITIAL_SEED, Col.DYNAMICS_SEED, Col.TOKEN_IDS, Col.EPISODE_RETURN):
        assert table[col].to_pylist() == clean[col].to_pylist(), col
