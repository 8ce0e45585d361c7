"""``RunnerPool``: the Algorithm's env runners as one sampler.

Sharding groups over remote runners, merging and checking their rows, broadcasting weights (one
``ray.put`` for all), bringing restarted runners back to the current policy, and re-sampling the
groups of a runner that died. With no remote runner, the local runner does everything in-process.
The Algorithm (``algorithms/starpo/algorithm.py``) only asks for rows and for a weight sync.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ragen_rllib.trajectory.schema import Col

logger = logging.getLogger(__name__)

#: Learner 0's policy weights, HF-named numpy arrays (fetched only when a runner needs them).
WeightsFn = Callable[[], dict[str, Any]]


class RunnerPool:
    """Sampling and weight sync over an RLlib ``EnvRunnerGroup`` of ``LLMEnvRunner``s.

    Args:
        group: the Algorithm's ``env_runner_group``.
        failures_tolerance: attempts of one sample call that may lose a chunk
            (``num_consecutive_env_runner_failures_tolerance``).
        health_timeout_s: how long to wait for a restarted runner when none is healthy
            (``env_runner_health_probe_timeout_s``).
    """

    def __init__(self, group: Any, failures_tolerance: int, health_timeout_s: float) -> None:
        self.group, self.failures_tolerance, self.health_timeout_s = group, failures_tolerance, health_timeout_s

    @property
    def local(self) -> Any:
        return self.group.local_env_runner

    def restarts(self) -> int:
        """Remote runner restarts so far (Ray restarts a dead runner actor)."""
        return int(self.group.num_remote_worker_restarts())

    # ----------------------------------------------------------------- sampling
    def sample(self, groups: list[tuple[int, int]], group_size: int, kw: dict[str, Any], policy_version: int,
               weights: WeightsFn) -> tuple[list[dict], dict[str, float], int]:
        """Split groups across runners, roll out, merge rows by (group_id, sample_idx).

        Groups are dealt round-robin into one chunk per remote runner (``groups[i::n]``). Before
        sampling, restarted runners are restored and any runner behind ``policy_version`` gets the
        current weights (``bring_to_policy``). A chunk whose runner dies mid-rollout is re-sampled
        whole, with the same groups and seeds, on a healthy or restarted runner (``sample_chunks``),
        so every group comes from exactly one runner's result.

        Args:
            groups: ``[(group_id, initial_seed)]``. group_size: samples per group.
            kw: the rest of ``LLMEnvRunner.sample``'s arguments (env, temperature, seeds, ...).

        Returns:
            ``len(groups) * group_size`` rows sorted by (group_id, sample_idx), the runners' summed
            stats (``wall_s``: seconds of the whole call, retries included), and how many groups
            were sampled again after a runner died.

        Raises:
            RuntimeError: a runner's rows carry another ``policy_version``; a group is missing,
                duplicated or has the wrong initial seed; or more than ``failures_tolerance``
                attempts of this call lost a chunk.
        """
        kw = dict(kw, group_size=group_size)
        t0 = time.perf_counter()
        self.bring_to_policy(policy_version, weights)
        n = self.group.num_remote_env_runners()
        resampled = 0
        if n == 0:
            outs = [self.local.sample(groups=groups, **kw)]
        else:
            chunks = [groups[i::n] for i in range(n) if groups[i::n]]
            outs, resampled = self.sample_chunks(chunks, kw, policy_version, weights)
        for o in outs:
            versions = sorted({r[Col.POLICY_VERSION] for r in o["rows"]} | {o["policy_version"]})
            if versions != [policy_version]:
                raise RuntimeError(f"env runner {o['worker_index']} returned rows with policy_version {versions}, "
                                   f"but the algorithm is at policy_version {policy_version}")
        rows = sorted((row for o in outs for row in o["rows"]), key=lambda r: (r[Col.GROUP_ID], r[Col.SAMPLE_IDX]))
        check_merged_groups(rows, groups, group_size)
        stats = {k: float(sum(o["stats"][k] for o in outs)) for k in outs[0]["stats"]}
        stats["wall_s"] = time.perf_counter() - t0
        return rows, stats, resampled

    def sample_chunks(self, chunks: list[list[tuple[int, int]]], kw: dict[str, Any], policy_version: int,
                      weights: WeightsFn) -> tuple[list[dict], int]:
        """Sample each chunk of groups on a remote runner; re-sample the chunks of runners that died.

        A runner that dies in a call (``RayActorError``) is marked unhealthy by RLlib and its result
        is dropped (with ``restart_failed_env_runners``, the default; without it, the error
        propagates). Each missing chunk is sent again, whole, to the runners healthy now, after
        ``bring_to_policy`` restored those already restarted and pushed them the current weights;
        a runner still restarting rejoins at a later call. With no healthy runner left it waits up
        to ``health_timeout_s`` for a restart. An exception raised by ``sample`` itself comes back
        by value and is raised here: a bug is not retried.

        Returns:
            one ``LLMEnvRunner.sample`` output per chunk (chunk order), and the number of groups
            that were sampled again.
        """
        g = self.group
        done: dict[int, dict[str, Any]] = {}
        failures = resampled = 0
        while True:
            pending = [c for c in range(len(chunks)) if c not in done]
            ids = g.healthy_env_runner_ids()
            if ids:
                funcs = [functools.partial(sample_chunk_on_runner, chunk=c, groups=chunks[c], sample_kwargs=kw)
                         for c in pending]
                results = g.foreach_env_runner(funcs, kwargs=[{} for _ in funcs], local_env_runner=False,
                                               remote_worker_ids=[ids[k % len(ids)] for k in range(len(pending))])
                for c, out, error in results:
                    if error is not None:
                        raise RuntimeError(f"env runner failed sampling groups {chunks[c]}:\n{error}")
                    done[c] = out
            missing = [c for c in pending if c not in done]
            if not missing:
                return [done[c] for c in range(len(chunks))], resampled
            failures += 1
            if failures > self.failures_tolerance:
                raise RuntimeError(f"env runners failed {failures} attempts at sampling groups "
                                   f"{[gr for c in missing for gr in chunks[c]]} (healthy runners: {ids}); "
                                   f"num_consecutive_env_runner_failures_tolerance={self.failures_tolerance}")
            if ids:  # these groups were sent and lost: they are sampled again, whole
                resampled += sum(len(chunks[c]) for c in missing)
                logger.warning("env runner lost during sampling (attempt %d): re-sampling groups %s", failures,
                               [gr[0] for c in missing for gr in chunks[c]])
            self.bring_to_policy(policy_version, weights)
            deadline = time.monotonic() + self.health_timeout_s
            while not g.healthy_env_runner_ids() and time.monotonic() < deadline:
                time.sleep(1.0)  # every runner is restarting: poll until one answers a ping
                self.bring_to_policy(policy_version, weights)

    # ------------------------------------------------------------------ weights
    def broadcast(self, weights: WeightsFn, version: int, remote_worker_ids: list[int] | None = None
                  ) -> tuple[list[dict[str, Any]], float]:
        """Load learner 0's policy weights, stamped ``version``, into env runners.

        Args:
            remote_worker_ids: the remote runners to load (RLlib ids, equal to ``worker_index``);
                None: every healthy remote runner, or the local runner when there are none.

        Returns:
            the runners' ``load_policy`` reports, and seconds from the ``ray.put`` to the last answer.

        Raises:
            RuntimeError: a runner reports a ``policy_version`` other than ``version``.
        """
        import ray

        named = weights()
        t0 = time.perf_counter()
        if self.group.num_remote_env_runners() == 0:
            reports = [self.local.load_policy(named, version)]
        else:
            ref = ray.put(named)  # once through the object store, not once per runner
            reports = self.group.foreach_env_runner(
                lambda r: r.load_policy(ref, version), remote_worker_ids=remote_worker_ids, local_env_runner=False)
        seconds = time.perf_counter() - t0
        wrong = {r["worker_index"]: r["policy_version"] for r in reports if r["policy_version"] != version}
        if wrong:
            raise RuntimeError(f"env runners {sorted(wrong)} report policy_version {wrong} after loading "
                               f"policy_version {version}")
        return reports, seconds

    def bring_to_policy(self, version: int, weights: WeightsFn) -> None:
        """Restore restarted env runners and load the current weights into any runner behind.

        A runner restarted by Ray (RLlib creates them with ``max_restarts``) comes back from its
        constructor: weights from disk, ``policy_version`` 0; so do all runners after a checkpoint
        restore. One ``policy_info`` round trip per call finds them. ``probe_unhealthy_env_runners``
        is a no-op unless a runner is marked unhealthy; it then pings it (a runner still restarting
        answers "unavailable" at once and stays out of service until a later call).
        """
        g = self.group
        if g.num_remote_env_runners() == 0:
            if self.local.policy_version != version:
                self.broadcast(weights, version)
            return
        g.probe_unhealthy_env_runners()
        infos = g.foreach_env_runner(lambda r: r.policy_info(), local_env_runner=False)
        behind = [i["worker_index"] for i in infos if i["policy_version"] != version]
        if behind:
            self.broadcast(weights, version, behind)


def sample_chunk_on_runner(runner: Any, *, chunk: int, groups: list[tuple[int, int]],
                           sample_kwargs: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str | None]:
    """Run inside a runner: ``(chunk, sample output, None)`` or ``(chunk, None, traceback)``.

    The exception is returned, not raised: RLlib's ``apply`` would kill the runner for it and the
    chunk would be retried, while a bug should fail once with its traceback.
    """
    import traceback

    try:
        return chunk, runner.sample(groups=groups, **sample_kwargs), None
    except Exception:  # noqa: BLE001 -- returned to the driver, which raises it
        return chunk, None, f"env runner {runner.worker_index}: {traceback.format_exc()}"


def check_merged_groups(rows: list[dict], groups: Sequence[tuple[int, int]], group_size: int) -> None:
    """Every requested group exactly ``group_size`` times (sample_idx 0..N-1), its seed, nothing else."""
    got = Counter((r[Col.GROUP_ID], r[Col.SAMPLE_IDX]) for r in rows)
    want = {(gid, i) for gid, _ in groups for i in range(group_size)}
    seeds = dict(groups)
    dup = sorted(k for k, c in got.items() if c > 1)
    missing, extra = sorted(want - set(got)), sorted(set(got) - want)
    bad_seed = sorted({r[Col.GROUP_ID] for r in rows if seeds.get(r[Col.GROUP_ID], r[Col.INITIAL_SEED])
                       != r[Col.INITIAL_SEED]})
    if dup or missing or extra or bad_seed:
        raise RuntimeError(f"merged rollout rows do not match the requested groups (group_size={group_size}): "
                           f"duplicated (group_id, sample_idx) {dup[:8]}, missing {missing[:8]}, "
                           f"unexpected {extra[:8]}, wrong initial seed in groups {bad_seed[:8]}")
