"""``Session``: the run lifecycle around a StarPO Algorithm, written once.

``open`` (tags, params, resolved config, warm-up) -> ``step(i)`` per RL iteration (flat metrics,
timing, memory, Echo-Trap signals and flags, MLflow) -> ``finish`` (final validation, export,
curves, summary) -> ``close(status)`` (the run report ``<run>/report.html``). ``train()``
(``ragen-rllib train``: the loop plus checkpoint/resume) and the Tune trainable
(``sweep.StarPOTrainable``) both drive one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ragen_rllib.algorithms.starpo.experiment import Experiment
from ragen_rllib.algorithms.starpo.params import StarPOParams
from ragen_rllib.console import log_summary, log_warning, progress
from ragen_rllib.tracking import report as run_report

#: Shown in the one progress line per iteration.
KEY_METRICS = ("rollout/success", "rollout/return_mean", "rollout/well_formed_rate", "filter/std_all_mean",
               "actor/entropy", "time/iteration")
#: The validation protocol, saved next to an exported model so ``eval`` repeats it.
EVAL_PROTOCOL_FILE = "ragen_eval_protocol.json"
_NAMESPACES = ("rollout", "filter", "actor", "critic", "time", "val", "learner", "faults", "echo", "policy_version")


class Session:
    """One run's tracking and lifecycle (see the module docstring).

    Args:
        exp: the experiment. algo: the built Algorithm. tracker: an ``MLflowTracker`` (not started).
        run_folder: this run's folder (curves, exported model).
        log: where progress lines go.
        history: metrics of iterations already done (a resumed run), in order.
        logged: MLflow steps <= this are already in the run (a resumed run); each step is logged once.
        memory: a started ``PeakMemory`` whose metrics join each iteration's, or None.
    """

    def __init__(self, exp: Experiment, algo: Any, tracker: Any, run_folder: Path,
                 log: Callable[[str], None] = print, history: list[dict[str, float]] | None = None,
                 logged: int = -1, memory: Any = None) -> None:
        from ragen_rllib.tracking.echo_trap import EchoTrapMonitor

        self.exp, self.algo, self.tracker, self.run_folder, self.log = exp, algo, tracker, Path(run_folder), log
        self.history: list[dict[str, float]] = list(history or [])
        self.logged = logged
        self.memory = memory
        self.monitor = EchoTrapMonitor()
        for step, m in enumerate(self.history):  # a resumed run's monitor sees the whole curve
            self.monitor.update(m, step=step)

    def open(self, fresh: bool = True) -> Session:
        """Start the MLflow run; a fresh run logs its params and resolved config."""
        self.tracker.start()
        if fresh:
            exp = self.exp
            self.tracker.log_params({"starpo": exp.starpo, "iterations": exp.iterations, "preset": exp.preset,
                                     "rllib": exp.config.get("rllib") or {}, "warmup": exp.config.get("warmup") or {},
                                     "profile": exp.profile or "default", "source": exp.source})
            self.tracker.log_dict(json.loads(json.dumps(dict(exp.config), default=str)), "config/resolved.json")
        return self

    def warm_up(self) -> None:
        """The experiment's supervised warm-up (if any), its metrics logged as ``warmup/*`` per step."""
        warm = self.exp.warmup
        if warm.steps:
            lr = "" if warm.lr is None else f" at LR {warm.lr:g}"
            self.log(f"[warm-up] {warm.steps} supervised steps on {warm.kind} demonstrations{lr}")
            if (note := warm.duplicate_demos_note()) is not None:
                log_warning(self.log, note)
            # One "[warm-up s/N] sft/loss=.." line per step; on a terminal a bar showing the loss instead.
            bar = progress(self.log, total=warm.steps, desc="warm-up", keep_lines=False)

            def step(line: str) -> None:
                bar.step(line, postfix=" ".join(t for t in line.split() if "loss=" in t))

            for s, m in enumerate(self.algo.warmup(warm.steps, warm.kind, groups=warm.groups,
                                                   group_size=warm.group_size, log=step,
                                                   lr=warm.lr)):
                self.tracker.log_metrics({f"warmup/{k.split('/')[-1]}": v for k, v in m.items()}, step=s)
            bar.close()
        return self

    def step(self, i: int, result: Mapping[str, Any], seconds: float) -> dict[str, float]:
        """Record RL iteration ``i`` (0-based) from ``algo.train()``'s result: flat metrics, time,
        memory, Echo-Trap messages and flags; appended to ``history``. ``log_step`` sends it."""
        m = flat_metrics(result)
        m["time/iteration"] = seconds
        if self.memory is not None:
            m.update(self.memory.metrics())
        for sig in self.monitor.update(m, step=i):
            log_warning(self.log, sig.message)
        m.update(self.monitor.flags())
        self.history.append(m)
        run_report.append_metrics(self.run_folder, i, m)  # <run>/metrics.jsonl: what the run report plots
        return m

    def log_step(self, i: int, m: Mapping[str, float]) -> None:
        """Send iteration ``i``'s metrics to MLflow, once: a step already in the run is skipped.
        Its trajectory file is recorded as a dataset input every time (``log_trajectories``)."""
        self.log_trajectories(i)
        if i > self.logged:
            self.tracker.log_metrics(dict(m), step=i)
            self.logged = i

    def log_trajectories(self, i: int) -> None:
        """Record iteration ``i``'s Parquet file as a ``training`` dataset input of the MLflow run
        (source: its path; digest: a hash of its bytes; input tag ``iteration``), so the run shows
        what it trained on. A redone iteration (``--resume``) wrote a new file: it is added too."""
        store = getattr(self.algo, "store", None)
        path = store.path_for(i) if store is not None else None
        if path is None or not path.is_file():
            return
        import pyarrow.parquet as pq

        self.tracker.log_dataset(path, name=f"{store.run_id}/{path.stem}", context="training",
                                 tags={"iteration": i}, profile={"num_rows": pq.read_metadata(path).num_rows})

    def progress_line(self, i: int, m: Mapping[str, float], eta_s: float) -> str:
        """``[i/N] success=.. return_mean=.. ... val/<env>/success=.. eta ..s``."""
        shown = " ".join(f"{k.split('/')[-1]}={m[k]:.3g}" for k in KEY_METRICS if k in m)
        val = " ".join(f"{k}={v:.3f}" for k, v in m.items() if k.startswith("val/") and k.endswith("/success"))
        return f"[{i + 1}/{self.exp.iterations}] {shown} {val} eta {eta_s:.0f}s"

    def validate(self) -> dict[str, float]:
        """The final validation (when the run validates at all), logged one step after the last iteration."""
        final = self.algo.validate() if self.exp.starpo.test_freq else {}
        self.tracker.log_metrics(final, step=len(self.history))
        if final:
            run_report.append_metrics(self.run_folder, len(self.history), final, final=True)
            log_summary(self.log, " ".join(f"{k}={v:.3f}" for k, v in final.items()))
        return final

    def export(self) -> Path:
        """The trained policy as a Hugging Face folder ``<run>/hf_model`` (+ its eval protocol),
        logged to MLflow unless ``tracking.log_model`` is false, and registered in the Model
        Registry under the experiment's name unless ``tracking.register_model`` is false (source:
        the logged artifact, else the local folder)."""
        hf_dir = export_hf(self.algo, self.run_folder / "hf_model")
        (hf_dir / EVAL_PROTOCOL_FILE).write_text(json.dumps(eval_protocol(self.exp.starpo), indent=2))
        self.tracker.set_tags({"hf_model": str(hf_dir)})
        tracking = self.exp.tracking
        if tracking.log_model:
            self.tracker.log_artifact(str(hf_dir), "hf_model")
        if tracking.register_model:
            uri = self.tracker.register_model(self.exp.mlflow_experiment, local_path=hf_dir,
                                              artifact_path="hf_model" if tracking.log_model else None)
            if uri:
                log_summary(self.log, f"model registered as {uri} (evaluate: ragen-rllib eval --model {uri})")
        return hf_dir

    def summarize(self, final_val: Mapping[str, float]) -> None:
        """Learning curves to MLflow and the summary table to the log (when iterations ran)."""
        if self.history:
            log_curves(self.tracker, self.history, self.run_folder)
            print_summary(self.history, final_val, lambda line: log_summary(self.log, line))

    def close(self, status: str) -> None:
        """Write the run report, then end the MLflow run with ``status`` (FINISHED, FAILED, KILLED)."""
        self.write_report()
        self.tracker.end(status)

    def write_report(self) -> Path | None:
        """``<run>/report.html`` (``tracking.report``: curves, Echo-Trap dashboard, stage times,
        episodes), logged to MLflow. A report that cannot be built or logged is a warning: it never
        changes how the run ends. Returns its path, or None (no run folder yet, or it failed)."""
        if not self.run_folder.is_dir():
            return None
        try:
            path = run_report.write_report(self.run_folder)
            self.tracker.log_artifact(str(path))
        except Exception as e:  # the report is a by-product: a failed run must still close as such
            log_warning(self.log, f"run report not written: {type(e).__name__}: {e}")
            return None
        log_summary(self.log, f"run report: {path} (rebuild: ragen-rllib report {self.run_folder})")
        return path


def flat_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """Our namespaced scalar metrics out of an RLlib result dict (NaN placeholders dropped)."""
    out: dict[str, float] = {}

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, Mapping):
            for k, v in d.items():
                walk(f"{prefix}{k}" if not prefix else f"{prefix}/{k}", v)
        elif isinstance(d, (int, float)) and not isinstance(d, bool):
            if math.isfinite(float(d)):  # RLlib reports keys not logged this iteration (e.g. val/) as NaN
                out[prefix] = float(d)

    for k, v in result.items():
        if isinstance(k, str) and k.split("/")[0] in _NAMESPACES:
            walk(k, v)
    return out


def eval_protocol(p: StarPOParams) -> dict[str, Any]:
    """The validation protocol of a run, saved next to its exported model so ``eval`` repeats it."""
    return {"val_envs": list(p.val_envs or (p.env,)), "val_groups": p.val_groups, "val_group_size": p.val_group_size,
            "val_temperature": p.val_temperature, "val_seed": p.val_seed, "enable_think": p.enable_think,
            "response_length": p.response_length, "max_turns": p.max_turns, "engine": p.engine,
            "max_context_tokens": p.max_context_tokens, "max_actions_per_turn": p.max_actions_per_turn,
            "format_penalty": p.format_penalty, "penalize_dropped_actions": p.penalize_dropped_actions,
            "env_config": dict(p.env_config),
            "stop_at_answer_end": p.stop_at_answer_end}


def export_hf(algo: Any, out: Path) -> Path:
    """Save the trained policy as a Hugging Face folder (loadable by transformers and vLLM)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.models import resolve_model

    src = resolve_model(algo.config.starpo.model)
    weights = next(iter(algo.learner_group.foreach_learner(lambda lrn: lrn.policy_weights()))).get()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, local_files_only=True)
    # assign: the model takes the learner's arrays as its weights instead of copying them into its
    # own, which are views of the mapped checkpoint file: a copy touched and duplicated all of them
    # (+0.5 GB for SmolLM2-135M at the end of a run).
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, assign=True)
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(src), local_files_only=True).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def log_curves(tracker: Any, history: list[dict[str, float]], out_dir: Path) -> None:
    """``<out_dir>/learning_curves.png`` (success, reward std, entropy, length, validation), to MLflow."""
    from ragen_rllib.tracking.plots import plot_curves

    keys = [k for k in ("rollout/success", "filter/std_all_mean", "actor/entropy", "rollout/response_length_mean")
            if any(k in h for h in history)]
    keys += sorted({k for h in history for k in h if k.startswith("val/") and k.endswith("/success")})
    png = plot_curves(history, keys, out_dir / "learning_curves.png", title=out_dir.name)
    if png is not None:
        tracker.log_artifact(str(png))


def print_summary(history: list[dict[str, float]], final_val: Mapping[str, float], log: Callable[[str], None]) -> None:
    """First and last value of the key metrics, then the final validation."""
    if not history:
        return
    keys = [k for k in ("rollout/success", "rollout/return_mean", "rollout/well_formed_rate", "filter/std_all_mean",
                        "filter/zero_std_frac", "actor/entropy", "actor/grad_norm", "rollout/response_length_mean",
                        "time/iteration") if k in history[-1]]
    log(f"{'metric':<32} {'first':>10} {'last':>10}")
    for k in keys:
        log(f"{k:<32} {history[0].get(k, float('nan')):>10.4g} {history[-1].get(k, float('nan')):>10.4g}")
    for k, v in final_val.items():
        log(f"{'final ' + k:<32} {'':>10} {v:>10.4g}")
