"""The ``ragen-rllib`` command line.

Subcommands: ``envs``, ``play``, ``prompt``, ``models list|prepare``, ``rollout``, ``trajectories show``,
``report``, ``doctor``.
Heavy libraries (transformers) are imported only by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence, TextIO

from ragen_rllib.console import LOGS_DIR, NORMAL, QUIET, VERBOSE, Console, logging_restored, route_library_output
from ragen_rllib.envs import list_envs, make_env
from ragen_rllib.envs.registry import env_class
from ragen_rllib.errors import ConfigError
from ragen_rllib.prompting import PromptConfig, Turn, build_messages, execute_reply

DEFAULT_MODEL = "smollm2-135m-instruct"


def _parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> dict (the one parser: ``experiment.parse_sets``); a bad item exits."""
    from ragen_rllib.algorithms.starpo.experiment import parse_sets  # yaml + params: no torch, no ray

    try:
        return parse_sets(pairs)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _make(args: argparse.Namespace):
    try:
        return make_env(args.env, variant=args.variant, **_parse_overrides(args.set or []))
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"error: {e.args[0] if e.args else e}") from None


def cmd_envs(args: argparse.Namespace, out: TextIO) -> int:
    rows = []
    for name in list_envs():
        try:
            cls = env_class(name)
            rows.append((name, ", ".join(cls.VARIANTS), cls.DESCRIPTION))
        except ImportError as e:  # a broken plugin must not hide the others
            rows.append((name, "?", f"(cannot load: {e})"))
    w0 = max(len(r[0]) for r in rows + [("env", "", "")])
    w1 = max(len(r[1]) for r in rows + [("", "variants", "")])
    print(f"{'env':<{w0}}  {'variants':<{w1}}  description", file=out)
    for r in rows:
        print(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}", file=out)
    return 0


def _print_messages(msgs: list[dict[str, str]], out: TextIO, start: int = 0) -> None:
    for m in msgs[start:]:
        print(f"----- {m['role']} -----\n{m['content']}", file=out)


def cmd_play(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    env = _make(args)
    cfg = PromptConfig(enable_think=not args.no_think)
    obs, _ = env.reset(seed=args.seed, options={"dynamics_seed": args.dynamics_seed})
    turns = [Turn(state=obs, actions_left=env.actions_left)]
    shown = 0
    total = 0.0
    print(f"# {args.env} ({getattr(args, 'variant', None) or 'default'}), seed {args.seed}. This is the text the model "
          "sees. Type the reply; a reply without <answer> is wrapped as the answer. Ctrl-D quits.", file=out)
    for t in range(args.max_turns):
        msgs = build_messages(env, turns, cfg)
        _print_messages(msgs, out, shown)
        shown = len(msgs)
        print(f"----- assistant -----\n{cfg.generation_prefix}", end="", file=out, flush=True)
        line = inp.readline()
        if not line:
            print("\n(quit)", file=out)
            return 0
        line = line.rstrip("\n")
        reply = cfg.generation_prefix + line
        if "<answer>" not in reply:
            reply = ("<think></think><answer>" if cfg.enable_think else "<answer>") + line + "</answer>"
            print(f"(as reply: {reply})", file=out)
        res = execute_reply(env, reply, cfg)
        turns[-1].response, turns[-1].reward = reply, res.env_reward
        total += res.reward
        print(f"[turn {t + 1}: env reward {res.env_reward:g}, penalty {res.penalty:g}, valid {res.num_valid}, "
              f"invalid {res.num_invalid}, dropped {res.num_dropped}, well-formed {res.parsed.well_formed}]", file=out)
        if res.done:
            print(f"----- episode over -----\n{res.observation}\n"
                  f"{'success' if res.success else 'failure'}{' (action budget used up)' if res.truncated else ''}; "
                  f"return {total:g}", file=out)
            return 0
        turns.append(Turn(state=res.observation, actions_left=env.actions_left))
    print(f"----- max turns ({args.max_turns}) reached -----; return {total:g}", file=out)
    return 0


def cmd_prompt(args: argparse.Namespace, out: TextIO) -> int:
    names = list_envs() if args.env == "all" else [args.env]
    tok = None
    if args.model:
        from ragen_rllib.models.loading import load_tokenizer

        try:
            tok = load_tokenizer(args.model)
        except FileNotFoundError as e:
            raise SystemExit(f"error: {e}") from None
    for name in names:
        ns = argparse.Namespace(**{**vars(args), "env": name, "variant": args.variant if args.env != "all" else None})
        for think in ([True, False] if args.both_formats else [not args.no_think]):
            env = _make(ns)
            cfg = PromptConfig(enable_think=think)
            obs, _ = env.reset(seed=args.seed)
            msgs = build_messages(env, [Turn(state=obs, actions_left=env.actions_left)], cfg)
            fmt = "think" if think else "no-think"
            print(f"=================== {name} ({fmt}) ===================", file=out)
            if tok is None:
                _print_messages(msgs, out)
            else:
                from ragen_rllib.prompting import render_prompt

                text = render_prompt(tok, msgs, cfg)
                n_tokens = len(tok(text, add_special_tokens=False)["input_ids"])
                print(text, file=out)
                print(f"[{n_tokens} prompt tokens with the {args.model} chat template]", file=out)
    return 0


def cmd_models(args: argparse.Namespace, out: TextIO) -> int:
    from ragen_rllib.models import KNOWN_MODELS, default_cache_dir, resolve_model

    if args.models_cmd == "list":
        for name, _src in KNOWN_MODELS.items():
            try:
                where = str(resolve_model(name, cache_dir=args.cache_dir))
            except FileNotFoundError:
                where = "not prepared"
            print(f"{name:<24} {where}", file=out)
        print(f"cache: {args.cache_dir or default_cache_dir()}", file=out)
        return 0
    from ragen_rllib.models.prepare import prepare_model

    try:
        path = prepare_model(args.name, cache_dir=args.cache_dir, force=args.force)
    except (KeyError, FileNotFoundError, ImportError, ValueError) as e:
        raise SystemExit(f"error: {e.args[0] if e.args else e}") from None
    print(path, file=out)
    return 0


def cmd_rollout(args: argparse.Namespace, out: TextIO) -> int:
    from ragen_rllib.env_runners.rollout_job import RolloutJob, run_job
    from ragen_rllib.trajectory.summary import summary_table

    envs = [e for spec in args.env for e in spec.split(",") if e]
    for e in envs:  # fail fast on a bad env name before an engine starts
        name, _, variant = e.partition(":")
        try:
            make_env(name, variant=variant or None, **_parse_overrides(args.set or []))
        except (KeyError, TypeError, ValueError) as err:
            raise SystemExit(f"error: {err.args[0] if err.args else err}") from None
    _require_model(args.model, key="--model")
    job = RolloutJob(envs=envs, model=args.model, engine=args.engine, groups=args.groups, group_size=args.group_size,
                     max_turns=args.max_turns, iterations=args.iterations, out=args.out, run_id=args.run_id,
                     seed=args.seed, enable_think=not args.no_think, temperature=args.temperature,
                     max_new_tokens=args.max_new_tokens, max_context_tokens=args.max_context_tokens,
                     env_config=_parse_overrides(args.set or []))
    try:
        run_dir, results = run_job(job, log=Console(sys.stderr, verbosity=args.verbosity).install())
    except (FileNotFoundError, ImportError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    fmt = "no-think" if args.no_think else "think"
    print(f"\nrollout summary ({args.engine} engine, {args.model}, {fmt} format, "
          f"{args.groups} groups x {args.group_size} samples x {args.iterations} iteration(s))", file=out)
    print(summary_table([(r.env, r.summary) for r in results]), file=out)
    print(f"trajectories: {run_dir}  (show with: ragen-rllib trajectories show {run_dir})", file=out)
    return 0


def _require_run(run: Path, root: str) -> None:
    """Exit with one line unless ``run`` is a folder, or a run id stored under ``root``."""
    import difflib

    from ragen_rllib.trajectory import list_runs

    if run.is_dir():
        return
    if run.is_file():
        folder = run.parent.parent if run.parent.name == "trajectories" else None
        raise SystemExit(f"error: {str(run)!r} is a file; give the run folder that holds trajectories/"
                         + (f" ({folder})" if folder else "") + ", or a run id under --root")
    runs = list_runs(root)
    if run.name != str(run) or not runs:  # a path (not a bare id), or an empty store
        raise SystemExit(f"error: no run folder {str(run)!r}"
                         + ("" if run.name != str(run) else f" and no runs under --root {root!r}")
                         + "; give the folder `rollout`/`train` wrote, e.g. runs/<run>")
    if str(run) not in runs:
        close = difflib.get_close_matches(str(run), runs, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; runs there: {runs[:10]}"
        raise SystemExit(f"error: no run {str(run)!r} under --root {root!r}{hint}")


def cmd_trajectories(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    import pyarrow.compute as pc

    from ragen_rllib.trajectory import read_run
    from ragen_rllib.trajectory.schema import Col
    from ragen_rllib.trajectory.summary import render_episode, summarize, summary_table

    run = Path(args.run)
    _require_run(run, args.root)
    try:
        table = read_run(run) if run.is_dir() else read_run(args.root, run_id=args.run)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: cannot read run {args.run!r}: {e}") from None
    conds = []
    if args.env:
        name, _, variant = args.env.partition(":")
        conds.append(pc.equal(table[Col.ENV_NAME], name))
        if variant:
            conds.append(pc.equal(table[Col.ENV_VARIANT], variant))
    if args.group is not None:
        conds.append(pc.equal(table[Col.GROUP_ID], args.group))
    if args.iteration is not None:
        conds.append(pc.equal(table[Col.ITERATION], args.iteration))
    if args.success:
        conds.append(pc.equal(table[Col.SUCCESS], True))
    if args.failure:
        conds.append(pc.equal(table[Col.SUCCESS], False))
    for c in conds:
        table = table.filter(c)
    rows = table.slice(0, args.limit).to_pylist() if args.limit > 0 else table.to_pylist()
    for row in rows:
        print(render_episode(row) + "\n", file=out)
    print(summary_table([(f"{table.num_rows} matching", summarize(table))]), file=out)
    return 0


def cmd_doctor(args: argparse.Namespace, out: TextIO) -> int:
    """One line per check (``ok  <check>: ...`` / ``FAIL <check>: what to do``); 0 iff all are ok."""
    from ragen_rllib.launch.doctor import DoctorOptions, run_checks

    opts = DoctorOptions(quick=args.quick, cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                         run_dir=Path(args.run_dir), tracking_uri=args.tracking_uri)
    failed = 0
    for result in run_checks(opts):
        print(result.line(), file=out, flush=True)
        failed += not result.ok
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    """(Re)build ``<run>/report.html`` from the run folder and print its path (``--open``: also a browser)."""
    from ragen_rllib.tracking.report import write_report

    run = Path(args.run) if Path(args.run).is_dir() else Path(args.root) / args.run
    if not run.is_dir():
        raise SystemExit(f"error: no run folder {args.run!r} (looked in {run}); give a run folder, or a run name "
                         f"under --root ({args.root})")
    try:
        path = write_report(run, max_iterations=args.max_iterations,
                            max_episodes_per_iteration=args.max_episodes)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: cannot build the report of {run}: {e}") from None
    print(path.resolve(), file=out)
    if args.open:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return 0


def _require_new_run(run_dir: str, run_name: str | None) -> None:
    """A new run must not reuse the folder of a stored one (``stored_run_parts``): refused here,
    before anything starts, not at its first Arrow write minutes in."""
    from ragen_rllib.algorithms.starpo.train import stored_run_parts

    if not run_name:
        return  # a fresh timestamped name
    run = Path(run_dir) / run_name
    held = stored_run_parts(run)
    if held:
        raise SystemExit(f"error: --run-name {run_name!r}: {run} already holds a run ({', '.join(held)}); "
                         f"choose another name, or continue it with `ragen-rllib train --resume {run_name}"
                         f"{'' if run_dir == 'runs' else f' --run-dir {run_dir}'}`")


def _require_model(model: str, key: str = "starpo.model") -> None:
    """Exit with one line (and the fix) when a model (the experiment's ``key``, or a ``--model``
    flag) is not a local folder or a prepared name: before Ray or any engine starts, not after them."""
    from ragen_rllib.models import resolve_model

    try:
        resolve_model(model)
    except FileNotFoundError as e:
        first = " ".join(str(e).split())
        fix = ("Point it at a local Hugging Face folder with --set starpo.model=/path/to/model, or use --profile cpu "
               "(the embedded SmolLM2)." if key == "starpo.model" else
               f"Give {key} a local Hugging Face folder or a prepared name (see `ragen-rllib models list`).")
        raise SystemExit(f"error: {key}: {first} {fix}") from None


def _require_experiment_files(exp: Any) -> None:
    """Exit with one line when a file the experiment names is missing (its DeepSpeed JSON), before Ray starts."""
    path = exp.starpo.deepspeed_config
    if path and not Path(path).is_file():
        raise SystemExit(f"error: starpo.deepspeed_config: {path!r} does not exist; give the path of a DeepSpeed "
                         "JSON file, or leave it null (the ZeRO settings come from the starpo fields)")


def _require_tracking_uri(uri: str | None, open_store: bool = False) -> None:
    """Exit with one line when MLflow has no store for ``uri`` (``bogus://``), before anything starts;
    ``open_store``: also when MLflow refuses to open it (readers of an existing store)."""
    if not uri:
        return
    from ragen_rllib.tracking.mlflow_logger import check_tracking_uri

    try:
        check_tracking_uri(uri, open_store=open_store)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def cmd_train(args: argparse.Namespace, out: TextIO) -> int:
    from ragen_rllib.algorithms.starpo.experiment import Experiment, load_experiment
    from ragen_rllib.algorithms.starpo.train import load_resume_config, train

    if bool(args.config) == bool(args.resume):
        raise SystemExit("error: give either --config FILE (a new run) or --resume RUN (continue a run)")
    try:
        if args.resume:  # the run's own resolved config; --set may extend it (e.g. iterations=30)
            run = Path(args.resume) if Path(args.resume).is_dir() else Path(args.run_dir) / args.resume
            cfg = load_resume_config(run, overrides=args.set or [])
        else:
            cfg = load_experiment(args.config, profile=args.profile, overrides=args.set or [])
            if args.run_name:
                cfg["run_name"] = args.run_name
        exp = Experiment.from_dict(cfg)  # every key and value checked before anything starts
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}") from None
    if not args.resume:
        _require_new_run(exp.run_dir, exp.run_name)
    _require_model(exp.starpo.model)
    _require_experiment_files(exp)
    _require_tracking_uri(args.tracking_uri or exp.tracking.tracking_uri)
    from ragen_rllib.durable import CorruptFileError, DiskFullError

    try:
        res = train(exp, tracking_uri=args.tracking_uri, log=Console(out, verbosity=args.verbosity),
                    resume=bool(args.resume))
    except (DiskFullError, CorruptFileError) as e:  # an MLflow run it opened is closed as FAILED
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM before RL iterations handle it (engine start, warm-up)
        sig = signal.Signals[str(e)] if str(e) in ("SIGINT", "SIGTERM") else signal.SIGINT
        print(f"interrupted ({sig.name}) before the first RL iteration ended: nothing was checkpointed, the "
              f"MLflow run is closed as KILLED; start it again with the same command", file=sys.stderr)
        return 128 + sig
    print(f"checkpoint: {res['checkpoint']}\nhf model: {res['hf_model']}\nmlflow run: {res['mlflow_run_id']}", file=out)
    # Stopped by SIGINT/SIGTERM (checkpoint saved, MLflow run KILLED): the shell's 128 + signal number.
    return 128 + res["stop_signal"] if res.get("stop_signal") else 0


def _registry_model_dir(model_uri: str, tracking_uri: str | None) -> str:
    """The local folder of a registered model version (``models:/<name>/<version|latest>``,
    ``models:/<name>@<alias>``): used in place when local, else downloaded once into the cache."""
    from ragen_rllib.models import default_cache_dir
    from ragen_rllib.tracking.mlflow_logger import default_tracking_uri, resolve_model_uri

    uri = tracking_uri or default_tracking_uri("runs")  # as `train`: sqlite in the default run folder
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise SystemExit(f"error: no MLflow store at {uri} to resolve {model_uri} (pass --tracking-uri)")
    try:
        return str(resolve_model_uri(model_uri, uri, default_cache_dir() / "registry"))
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None


def cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    from ragen_rllib.algorithms.starpo.train import evaluate

    import json

    if not args.checkpoint and not args.config:
        raise SystemExit("error: give --checkpoint RUN_OR_MODEL_DIR (or --model models:/<name>/<version>), or "
                         "--config EXPERIMENT (its model, untrained, and its validation protocol)")
    registered, model = None, args.checkpoint
    if model and model.startswith("models:/"):
        registered, model = model, _registry_model_dir(model, args.tracking_uri)
        print(f"{registered}: {model}", file=out, flush=True)
    try:
        protocol = None
        if args.config:  # the experiment's validation protocol; --set takes its keys (starpo.val_groups=128)
            from ragen_rllib.algorithms.starpo.experiment import Experiment
            from ragen_rllib.algorithms.starpo.train import eval_protocol
            from ragen_rllib.models import resolve_model

            params = Experiment.load(args.config, profile=args.profile, sets=args.set or []).starpo
            protocol, overrides = eval_protocol(params), {}
            if not model:
                _require_model(params.model)
                model = str(resolve_model(params.model))
        else:
            overrides = _parse_overrides(args.set or [])
            _check_protocol_sets(overrides)
        if not registered:
            _require_checkpoint(model)
        envs = [e for s in (args.env or []) for e in s.split(",") if e]
        _require_envs(envs, "--env")
        console = Console(out, verbosity=args.verbosity).install()
        with route_library_output(console, _eval_log_dir(model, registered)):
            res = evaluate(model, envs=envs or None, engine=args.engine, overrides=overrides,
                           log=console.summary,  # each line is a result: shown also with -q
                           policy=args.policy, protocol=protocol, out_dir=args.out)
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"policy": args.policy, "model": model, "config": args.config,
                                               "profile": args.profile, "set": args.set or [],
                                               **({"registered_model": registered} if registered else {}), **res},
                                              indent=2))
    return 0


def _eval_log_dir(model: str, registered: str | None) -> Path:
    """Where ``eval`` writes the libraries' output: the evaluated run's ``logs/`` (a run folder, or
    its ``hf_model/``), else ``runs/eval/logs`` (a baseline, a registered or prepared model)."""
    path = Path(model)
    if not registered:
        if (path / "hf_model").is_dir():
            return path / LOGS_DIR
        if path.name == "hf_model":  # train writes a run's model there
            return path.parent / LOGS_DIR
    return Path("runs") / "eval" / LOGS_DIR


def _require_checkpoint(model: str) -> None:
    """Exit with one line unless ``model`` is a run folder, a model folder or a prepared model name."""
    path = Path(model)
    if (path / "hf_model").is_dir():
        path = path / "hf_model"
    if (path / "config.json").is_file():
        return
    from ragen_rllib.models import resolve_model

    try:
        resolve_model(model)
    except FileNotFoundError:
        raise SystemExit(f"error: --checkpoint {model!r} is not a run folder (with hf_model/), a Hugging Face model "
                         "folder (with config.json) or a prepared model name; give the run folder `train` wrote "
                         "(runs/<run>), or --config EXPERIMENT for its untrained model") from None


def _require_envs(specs: Sequence[str], flag: str) -> None:
    """Exit with one line when an ``env[:variant]`` of ``flag`` is not registered (before any engine starts)."""
    from ragen_rllib.envs.registry import make_env_config

    for spec in specs:
        try:
            make_env_config(spec)
        except (KeyError, ImportError) as e:
            raise SystemExit(f"error: {flag} {spec!r}: {e.args[0] if e.args else e} (see `ragen-rllib envs`)") from None


def _check_protocol_sets(overrides: dict[str, Any]) -> None:
    """Exit with one line when an ``eval --set`` key is not a validation-protocol key, or its value has the
    wrong type (the protocol's keys are ``StarPOParams`` fields: the same types apply)."""
    import dataclasses
    import difflib

    from ragen_rllib.algorithms.starpo.params import FIELD_TYPES, StarPOParams
    from ragen_rllib.algorithms.starpo.train import eval_protocol

    known = sorted(eval_protocol(StarPOParams()))
    types = {f.name: str(f.type) for f in dataclasses.fields(StarPOParams)}
    for key, value in overrides.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"keys: {known}"
            raise SystemExit(f"error: --set {key}: not a validation-protocol key; {hint}")
        check, what = FIELD_TYPES[types[key]]
        if not check(tuple(value) if isinstance(value, list) else value):
            raise SystemExit(f"error: --set {key} must be {what}, got {value!r}")


# --- Ray Jobs: `submit` and `job status|logs|stop|list` (ragen_rllib/launch/jobs.py) ---
JOB_EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 3}  # exit codes of `submit`/`job logs --follow`


def _job_address(args: argparse.Namespace) -> str:
    import os

    addr = args.address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not addr:
        raise SystemExit("error: --address is required (the Ray dashboard URL, e.g. http://127.0.0.1:8265)")
    from ragen_rllib.launch.jobs import check_address

    try:
        check_address(addr)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return addr


def _follow_job(addr: str, job_id: str, out: TextIO) -> int:
    from ragen_rllib.launch.jobs import failure_summary, follow_logs, job_info, job_logs

    try:
        status = follow_logs(addr, job_id, write=lambda s: (out.write(s), out.flush()))
    except KeyboardInterrupt:
        print(f"\nstopped following; job {job_id} keeps running (stop it: ragen-rllib job stop {job_id} "
              f"--address {addr})", file=sys.stderr)
        return 130
    if status == "SUCCEEDED":
        print(f"job {job_id} succeeded", file=out)
    elif status == "STOPPED":
        print(f"job {job_id} stopped", file=sys.stderr)
    else:
        print(failure_summary(job_info(addr, job_id), job_logs(addr, job_id)), file=sys.stderr)
    return JOB_EXIT_CODES.get(status, 1)


def cmd_submit(args: argparse.Namespace, out: TextIO) -> int:
    from ragen_rllib.launch.jobs import DEFAULT_EXCLUDES, JobsError, submit_training

    if args.list_upload:  # what the cluster would receive (Ray's own packing); nothing is submitted
        from ragen_rllib.launch.jobs import upload_manifest

        try:
            names = upload_manifest(args.working_dir, tuple(DEFAULT_EXCLUDES) + tuple(args.exclude or ()))
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        print("\n".join(names), file=out)
        return 0
    addr = _job_address(args)
    env_vars = {}
    for item in args.env_var or []:
        if "=" not in item:
            raise SystemExit(f"error: --env-var expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        env_vars[k] = v
    try:
        sid = submit_training(addr, args.config, profile=args.profile, overrides=args.set or [],
                              working_dir=args.working_dir, env_vars=env_vars, submission_id=args.submission_id,
                              tracking_uri=args.tracking_uri, run_name=args.run_name, python=args.python,
                              excludes=tuple(DEFAULT_EXCLUDES) + tuple(args.exclude or ()))
        print(f"submitted {sid} to {addr}\n  status: ragen-rllib job status {sid} --address {addr}\n"
              f"  logs:   ragen-rllib job logs {sid} --address {addr} --follow\n"
              f"  stop:   ragen-rllib job stop {sid} --address {addr}", file=out, flush=True)
        return 0 if args.no_follow else _follow_job(addr, sid, out)
    except (JobsError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


def cmd_job(args: argparse.Namespace, out: TextIO) -> int:
    from datetime import datetime

    from ragen_rllib.launch.jobs import JobsError, job_info, job_logs, list_jobs, stop_job

    addr = _job_address(args)
    try:
        if args.job_cmd == "list":
            for j in list_jobs(addr):
                when = (datetime.fromtimestamp(j["start_time"] / 1000).isoformat(" ", "seconds")
                        if j["start_time"] else "-")
                print(f"{j['submission_id']:<36} {j['status']:<10} {when}  {j['entrypoint']}", file=out)
            return 0
        if args.job_cmd == "status":
            info = job_info(addr, args.job_id)
            print(f"{info['submission_id']}: {info['status']}", file=out)
            if info["message"]:
                print(info["message"].strip().splitlines()[0], file=out)
            return 0
        if args.job_cmd == "logs":
            if args.follow:
                return _follow_job(addr, args.job_id, out)
            print(job_logs(addr, args.job_id), end="", file=out)
            return 0
        if args.job_cmd == "stop":
            stopped = stop_job(addr, args.job_id)
            print(f"{args.job_id}: {'stop requested' if stopped else 'already finished'}", file=out)
            return 0
    except JobsError as e:
        raise SystemExit(f"error: {e}") from None
    raise AssertionError(f"unhandled job command {args.job_cmd!r}")
# --- end Ray Jobs ---


# --- Tune sweeps and run comparison: `sweep`, `compare` (algorithms/starpo/sweep.py, tracking/compare.py) ---
def cmd_sweep(args: argparse.Namespace, out: TextIO) -> int:
    from ragen_rllib.algorithms.starpo.experiment import Experiment
    from ragen_rllib.algorithms.starpo.sweep_spec import load_sweep  # Ray-free: a bad file fails before Ray loads

    try:
        spec = load_sweep(args.config, overrides=args.set or [])
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}") from None
    base = Experiment.from_dict(spec.experiment)  # checked by load_sweep: cannot fail here
    _require_model(base.starpo.model)
    _require_experiment_files(base)
    _require_tracking_uri(args.tracking_uri or base.tracking.tracking_uri)
    console = Console(out, verbosity=args.verbosity).install()
    # Ray's and Tune's driver-side output (from their import on); each trial's own output stays in
    # its Ray worker's log.
    with route_library_output(console, Path(base.run_dir) / "tune" / spec.name / LOGS_DIR):
        from ragen_rllib.algorithms.starpo.sweep import run_sweep

        res = run_sweep(spec, tracking_uri=args.tracking_uri, log=console)
    return 1 if res["errors"] else 0


def cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from ragen_rllib.tracking.compare import (
        COMPARE_EXPERIMENT,
        common_parent,
        compare_runs,
        comparison_name,
        format_table,
        log_comparison,
        parse_tags,
        plot_comparison,
    )
    from ragen_rllib.tracking.mlflow_logger import default_tracking_uri

    if not args.experiment and not args.tag:
        raise SystemExit("error: give an EXPERIMENT, or --tag KEY=VALUE to pick runs across experiments")
    uri = args.tracking_uri or default_tracking_uri("runs")  # as `train`: sqlite in the default run folder
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise SystemExit(f"error: no MLflow store at {uri} (pass --tracking-uri)")
    _require_tracking_uri(uri, open_store=True)
    try:
        tags = parse_tags(args.tag or [])
        rows = compare_runs(uri, args.experiment, args.metric, parent_run_id=args.parent, mode=args.mode, tags=tags)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    what = " ".join([f"experiment {args.experiment!r}" if args.experiment else "any experiment",
                     *(f"tag {k}={v!r}" for k, v in tags.items())])
    if not rows and args.experiment:
        import difflib

        from ragen_rllib.tracking.mlflow_logger import experiment_names

        names = experiment_names(uri)
        if args.experiment not in names:
            close = difflib.get_close_matches(args.experiment, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"experiments there: {names[:20]}"
            raise SystemExit(f"error: no MLflow experiment {args.experiment!r} at {uri}; {hint}")
    if not rows:
        raise SystemExit(f"error: no runs to compare ({what}) at {uri}")
    table = format_table(rows, args.metric, args.mode)
    print(table, file=out)
    parent = args.parent or common_parent(rows)
    name = comparison_name(args.experiment, tags)
    png_path = Path(args.out or Path("runs") / "compare" / f"{name}{'_' + parent[:8] if parent else ''}.png")
    png = plot_comparison(rows, args.metric, png_path, title=f"{args.experiment or name}: {args.metric}")
    run_id = log_comparison(uri, args.experiment or COMPARE_EXPERIMENT, rows, args.metric, png, table,
                            parent_run_id=parent, local_dir=png_path.parent)
    print(f"comparison plot: {png}; logged to MLflow run {run_id}{' (the sweep run)' if parent else ''}", file=out)
    return 0
# --- end sweeps ---


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <what> (see `ragen-rllib <cmd> --help`)``, exit code 2.

    Subcommand parsers are made with the same class, so every usage error reads alike.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ragen-rllib", description="Multi-turn agent RL (RAGEN StarPO / StarPO-S) on Ray RLlib")
    sub = p.add_subparsers(dest="cmd", required=True)
    # -q / -v on the commands that run models (train, eval, rollout, sweep): ragen_rllib/console.py
    loud = argparse.ArgumentParser(add_help=False)
    g = loud.add_mutually_exclusive_group()
    g.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=VERBOSE, default=NORMAL,
                   help="also show the libraries' INFO logs (vLLM, Ray, transformers, MLflow) on the console")
    g.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=QUIET,
                   help="only warnings, errors and the final summary")

    sub.add_parser("envs", help="list registered envs and their variants")

    def env_args(sp: argparse.ArgumentParser, env_default: str | None = None) -> None:
        if env_default is None:
            sp.add_argument("env", help="env name (see `ragen-rllib envs`); 'env:variant' also works")
        else:
            sp.add_argument("env", nargs="?", default=env_default, help="env name, or 'all'")
        sp.add_argument("--variant", default=None)
        sp.add_argument("--seed", type=int, default=0, help="initial-state seed")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="env config override (repeatable)")
        sp.add_argument("--no-think", action="store_true", help="answer-only format (no <think> block)")

    sp = sub.add_parser("play", help="play an env in the terminal through the model's text interface")
    env_args(sp)
    sp.add_argument("--dynamics-seed", type=int, default=None)
    sp.add_argument("--max-turns", type=int, default=5)

    sp = sub.add_parser("prompt", help="show the first prompt of an env (rendered with a model's chat template)")
    env_args(sp, env_default="all")
    sp.add_argument("--model", default=None, help=f"model name or local HF folder, e.g. {DEFAULT_MODEL}")
    sp.add_argument("--both-formats", action="store_true", help="show the think and the no-think prompt")

    sp = sub.add_parser("rollout", help="roll out a model on envs, write Arrow, print a summary", parents=[loud])
    sp.add_argument("--env", action="append", required=True, help="env or env:variant; repeat or comma-separate")
    sp.add_argument("--model", default=DEFAULT_MODEL, help="known model name or local HF folder")
    sp.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    sp.add_argument("--groups", type=_positive_int, default=4, help="initial-state groups per iteration (P)")
    sp.add_argument("--group-size", type=_positive_int, default=4, help="samples per group (N)")
    sp.add_argument("--max-turns", type=_positive_int, default=None,
                    help="turns per episode (default: per env, RAGEN's)")
    sp.add_argument("--iterations", type=_positive_int, default=1)
    sp.add_argument("--out", default="runs", help="root folder of the trajectory store")
    sp.add_argument("--run-id", default=None)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--no-think", action="store_true")
    sp.add_argument("--temperature", type=float, default=1.0)
    sp.add_argument("--max-new-tokens", type=_positive_int, default=200)
    sp.add_argument("--max-context-tokens", type=_positive_int, default=3600)
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="env config override (repeatable)")

    sp = sub.add_parser("train", help="train StarPO / StarPO-S from an experiment YAML", parents=[loud])
    sp.add_argument("--config", default=None, help="experiments/<file>.yaml")
    sp.add_argument("--profile", default=None, help="named profile in the file, e.g. cpu")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. starpo.actor_lr=2e-5")
    sp.add_argument("--tracking-uri", default=None, help="MLflow URI (default: sqlite in the run folder)")
    sp.add_argument("--run-name", default=None)
    sp.add_argument("--resume", default=None, metavar="RUN",
                    help="continue RUN (a run name under --run-dir, or its folder) from its last checkpoint")
    sp.add_argument("--run-dir", default="runs", help="where runs live (for --resume RUN)")

    sp = sub.add_parser("eval", help="evaluate a trained model (or a baseline policy) with a validation protocol",
                        parents=[loud])
    sp.add_argument("--checkpoint", "--model", dest="checkpoint", default=None,
                    help="run folder, its hf_model folder, a local HF model folder, or a registered model "
                         "(models:/<name>/<version>, models:/<name>/latest, models:/<name>@<alias>) "
                         "(default with --config: the experiment's model, untrained)")
    sp.add_argument("--tracking-uri", default=None,
                    help="MLflow URI holding the registry for models:/ (default: sqlite:///runs/mlflow.db)")
    sp.add_argument("--config", default=None, help="experiment file whose validation protocol to use")
    sp.add_argument("--profile", default=None, help="profile of --config")
    sp.add_argument("--policy", default="model", choices=["model", "random-valid", "expert"],
                    help="who replies: the model, or a reference policy (random valid actions; the expert/BFS ceiling)")
    sp.add_argument("--json", default=None, metavar="PATH", help="also write the metrics as JSON")
    sp.add_argument("--out", default=None, metavar="DIR",
                    help="also store the rollouts as DIR/validation/<env>/iter_000000.parquet (a run's layout: "
                         "scripts/paired_validation.py compares them state by state)")
    sp.add_argument("--env", action="append", help="env[:variant]; default: the run's validation envs")
    sp.add_argument("--engine", default=None, choices=["vllm", "hf"])
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="protocol override, e.g. val_groups=128 (with --config: experiment keys, "
                         "e.g. starpo.val_groups=128)")

    # --- sweeps ---
    sp = sub.add_parser("sweep", help="Ray Tune sweep over StarPO knobs, trials as nested MLflow runs",
                        parents=[loud])
    sp.add_argument("--config", required=True, help="experiments/sweeps/<file>.yaml")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="sweep key (iterations=3, scheduler.grace_period=2) "
                         "or experiment override (starpo.actor_lr=2e-5)")
    sp.add_argument("--tracking-uri", default=None, help="MLflow URI (default: sqlite in the run folder)")
    sp = sub.add_parser("compare", help="table + plot of an MLflow experiment's runs (or one sweep's trials, "
                                        "or the runs with given tags)")
    sp.add_argument("experiment", nargs="?", default=None,
                    help="MLflow experiment name, e.g. ragen-bandit (optional with --tag: all experiments)")
    sp.add_argument("--tag", action="append", metavar="KEY=VALUE",
                    help="only runs with this tag value (repeatable: all must match), e.g. --tag env=bandit")
    sp.add_argument("--tracking-uri", default=None, help="MLflow URI (default: sqlite:///runs/mlflow.db)")
    sp.add_argument("--metric", default="rollout/success", help="e.g. val/bandit/success")
    sp.add_argument("--mode", default="max", choices=["max", "min"], help="what 'best' means for --metric")
    sp.add_argument("--out", default=None, help="PNG path (default: runs/compare/<experiment>[_<sweep>].png)")
    sp.add_argument("--parent", default=None, metavar="RUN_ID", help="compare only this sweep run's trials")
    # --- end sweeps ---

    # --- Ray Jobs ---
    sp = sub.add_parser("submit", help="submit training to a running Ray cluster (Ray Jobs API) and follow it")
    sp.add_argument("--address", default=None,
                    help="Ray dashboard URL, e.g. http://127.0.0.1:8265 "
                         "(default: $RAY_API_SERVER_ADDRESS / $RAY_ADDRESS)")
    sp.add_argument("--config", required=True, help="experiment YAML, relative to --working-dir")
    sp.add_argument("--profile", default=None, help="named profile in the file, e.g. cpu")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. starpo.actor_lr=2e-5")
    sp.add_argument("--tracking-uri", default=None,
                    help="MLflow URI as the job sees it (default: sqlite in its run folder)")
    sp.add_argument("--run-name", default=None)
    sp.add_argument("--working-dir", default=".", help="uploaded to the cluster (minus runs/, .venv, .git, weights)")
    sp.add_argument("--exclude", action="append", metavar="PATTERN", help="more gitignore-style upload excludes")
    sp.add_argument("--env-var", action="append", metavar="KEY=VALUE", help="env var for the job (repeatable)")
    sp.add_argument("--submission-id", default=None, help="default: ragen-<date>-<time>-<random>")
    sp.add_argument("--python", default="python", help="interpreter on the cluster with ragen-rllib installed")
    sp.add_argument("--no-follow", action="store_true", help="return after submitting instead of streaming logs")
    sp.add_argument("--list-upload", action="store_true",
                    help="print the files the working-dir upload would contain, submit nothing")
    sp = sub.add_parser("job", help="status, logs, stop or list Ray jobs")
    jsub = sp.add_subparsers(dest="job_cmd", required=True)
    for name, help_ in (("status", "state and message"), ("logs", "the driver's output"), ("stop", "stop a job"),
                        ("list", "all jobs on the cluster")):
        js = jsub.add_parser(name, help=help_)
        if name != "list":
            js.add_argument("job_id", help="submission id (see `ragen-rllib job list`)")
        js.add_argument("--address", default=None, help="Ray dashboard URL, e.g. http://127.0.0.1:8265")
        if name == "logs":
            js.add_argument("--follow", action="store_true", help="stream until the job ends; exit code = outcome")
    # --- end Ray Jobs ---

    sp = sub.add_parser("report", help="(re)build a run's self-contained HTML report and print its path")
    sp.add_argument("run", help="run folder, or a run name under --root")
    sp.add_argument("--root", default="runs", help="where runs live")
    sp.add_argument("--open", action="store_true", help="also open it in the default web browser")
    sp.add_argument("--max-iterations", type=int, default=12, help="iterations in the episode browser")
    sp.add_argument("--max-episodes", type=int, default=32, help="episodes per iteration in the episode browser")

    sp = sub.add_parser("trajectories", help="inspect stored trajectories")
    tsub = sp.add_subparsers(dest="traj_cmd", required=True)
    ts = tsub.add_parser("show", help="render stored episodes readably")
    ts.add_argument("run", help="run folder, or a run id under --root")
    ts.add_argument("--root", default="runs")
    ts.add_argument("--env", default=None, help="env or env:variant")
    ts.add_argument("--group", type=int, default=None)
    ts.add_argument("--iteration", type=int, default=None)
    g = ts.add_mutually_exclusive_group()
    g.add_argument("--success", action="store_true")
    g.add_argument("--failure", action="store_true")
    ts.add_argument("--limit", type=int, default=3, help="episodes to print (0 = all)")

    sp = sub.add_parser("models", help="list or prepare local models (no hub downloads)")
    msub = sp.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list")
    ml.add_argument("--cache-dir", default=None)
    mp = msub.add_parser("prepare", help="convert an embedded model into a Hugging Face folder in the cache")
    mp.add_argument("name", help=f"e.g. {DEFAULT_MODEL}")
    mp.add_argument("--cache-dir", default=None)
    mp.add_argument("--force", action="store_true")

    sp = sub.add_parser("doctor", help="check this machine: Python, torch, models, vLLM, Ray, MLflow, DeepSpeed, "
                                       "disk, memory (one line each)")
    sp.add_argument("--quick", action="store_true", help="do not start the vLLM engine and Ray (seconds, not a minute)")
    sp.add_argument("--cache-dir", default=None, help="prepared-model folder (default: $RAGEN_RLLIB_CACHE/models)")
    sp.add_argument("--run-dir", default="runs", help="run folder: its MLflow store and free disk (default: runs)")
    sp.add_argument("--tracking-uri", default=None, help="MLflow URI to check (default: sqlite in --run-dir)")
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, inp: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code.

    Bad input (config, key, value, path, model, env, address) ends the command before anything heavy
    starts, with one line ``error: <what and how to fix it>`` on stderr and no traceback: raised as
    ``SystemExit("error: ...")`` (exit code 1), and ``ConfigError`` from any layer is mapped the same
    way here. Command-line usage errors (argparse) exit with code 2, also in one line.
    """
    if argv is None:  # the real command line (not a test calling main): the allocator is set per process
        from ragen_rllib.launch.allocator import reexec_with_jemalloc

        reexec_with_jemalloc(sys.argv[1:])
    out = out or sys.stdout
    inp = inp or sys.stdin
    args = build_parser().parse_args(argv)
    if args.cmd == "play":
        return cmd_play(args, out, inp)
    commands = {"envs": cmd_envs, "prompt": cmd_prompt, "models": cmd_models, "rollout": cmd_rollout,
                "trajectories": cmd_trajectories, "train": cmd_train, "eval": cmd_eval, "submit": cmd_submit,
                "job": cmd_job, "sweep": cmd_sweep, "compare": cmd_compare, "report": cmd_report,
                "doctor": cmd_doctor}
    if args.cmd in commands:
        with logging_restored():  # a command's Console.install() (-q/-v) ends with the command
            try:
                return commands[args.cmd](args, out)
            except ConfigError as e:  # bad input found past a command's own checks: still one line
                raise SystemExit(f"error: {' '.join(str(e).split())}") from None
    raise AssertionError(f"unhandled command {args.cmd!r}")


if __name__ == "__main__":
    sys.exit(main())
