"""The ``ragen-rllib`` command line.

Subcommands (this issue): ``envs``, ``play``, ``prompt``, ``models list|prepare``.
Heavy libraries (transformers) are imported only by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence, TextIO

from ragen_rllib.envs import list_envs, list_variants, make_env
from ragen_rllib.envs.registry import env_class
from ragen_rllib.prompting import PromptConfig, Turn, build_messages, execute_reply

DEFAULT_MODEL = "smollm2-135m-instruct"


def _parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``["key=value", ...]`` into a dict, reading ints/floats/bools/tuples where they parse."""
    import ast

    out: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p:
            raise SystemExit(f"error: --set expects key=value, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k.strip()] = ast.literal_eval(v)  # literals only: never evaluates code
        except (ValueError, SyntaxError):
            out[k.strip()] = v
    return out


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
        for name, src in KNOWN_MODELS.items():
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ragen-rllib", description="Multi-turn agent RL (RAGEN StarPO / StarPO-S) on Ray RLlib")
    sub = p.add_subparsers(dest="cmd", required=True)

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

    sp = sub.add_parser("models", help="list or prepare local models (no hub downloads)")
    msub = sp.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list")
    ml.add_argument("--cache-dir", default=None)
    mp = msub.add_parser("prepare", help="convert an embedded model into a Hugging Face folder in the cache")
    mp.add_argument("name", help=f"e.g. {DEFAULT_MODEL}")
    mp.add_argument("--cache-dir", default=None)
    mp.add_argument("--force", action="store_true")
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, inp: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code."""
    out = out or sys.stdout
    inp = inp or sys.stdin
    args = build_parser().parse_args(argv)
    if args.cmd == "envs":
        return cmd_envs(args, out)
    if args.cmd == "play":
        return cmd_play(args, out, inp)
    if args.cmd == "prompt":
        return cmd_prompt(args, out)
    if args.cmd == "models":
        return cmd_models(args, out)
    raise AssertionError(f"unhandled command {args.cmd!r}")


if __name__ == "__main__":
    sys.exit(main())
