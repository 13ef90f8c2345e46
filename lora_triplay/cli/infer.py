"""Inference commands: `export`, `play`, `chat`, `serve`.

Thin: parse, then hand over to export.py, play.py, serve.py.
torch is imported only inside the commands, so `--help` stays instant.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from .common import USER_ERRORS, fail, quiet

RUN_DIR_ARG = typer.Argument(..., metavar="RUN_DIR", help="a run folder written by `lora-triplay run`, e.g. adapters/smoke-demo")
ITERATION_OPT = typer.Option(None, "--iteration", "-i", min=0, help="use the snapshots of iteration N (`<role>/iter-NNNN`; "
                                                                    "0 = untrained); default: the latest weights")
DEBUG_OPT = typer.Option(False, "--debug", help="show Python tracebacks")


def _check_run_dir(run_dir: Path) -> None:
    from ..bases import ModelError

    if not run_dir.is_dir():
        raise ModelError(f"run folder {run_dir} does not exist; pass the folder `lora-triplay run` wrote (e.g. adapters/smoke-demo)")


def _check_snapshots(run_dir: Path, iteration: Optional[int], specs: List[str]) -> None:
    """Every adapter a command will load exists, checked before the base
    loads (minutes on a 14B): the roles at `--iteration`, and each `role@N`."""
    from ..core.runs import read_run_recipe, snapshot_folder
    from ..core.snapshots import parse_role
    from ..core.store import RunStore
    from ..games import game_class

    store = RunStore(run_dir)
    if iteration is not None:
        for name in game_class(read_run_recipe(run_dir).game).roles:
            snapshot_folder(store, name, iteration)
    for spec in specs:
        name, it = parse_role(spec)
        if it is not None and it >= 0:
            snapshot_folder(store, name, it)


def _open(run_dir: Path, iteration: Optional[int], device: Optional[str]):
    from ..bases import ModelError
    from ..core.runs import open_run

    _check_run_dir(run_dir)
    if device not in (None, "auto", "cpu", "cuda"):
        raise ModelError(f"--device {device!r}: use cpu, cuda or auto")
    t0 = time.perf_counter()
    run = open_run(run_dir, iteration, device=device)
    from ..games import game_class

    typer.echo(f"loaded {run.recipe.model.base} with {'/'.join(game_class(run.recipe.game).roles)} "
               f"({'latest' if iteration is None else f'iteration {iteration}'}) in {time.perf_counter() - t0:.1f}s", err=True)
    return run


def export(
    run_dir: Path = RUN_DIR_ARG,
    role: str = typer.Option(..., "--role", "-r", help="`red`, `blue`, `eval`, a snapshot such as `blue@3`, "
                                                       "or `all` (writes OUT/red, OUT/blue, OUT/eval)"),
    out: Path = typer.Option(..., "--out", "-o", help="folder to write (created through a temp folder and a rename)"),
    iteration: Optional[int] = ITERATION_OPT,
    force: bool = typer.Option(False, "--force", help="replace OUT if it exists and is not empty"),
    device: str = typer.Option("cpu", "--device", help="where to merge: cpu or cuda"),
    debug: bool = DEBUG_OPT,
) -> None:
    """Merge a role's adapter into the base and write a standard Hugging Face model folder.

    The folder (safetensors weights in the base's dtype, config, generation
    config, tokenizer, chat template, plus `lora_triplay_export.json`) loads
    with `AutoModelForCausalLM.from_pretrained(OUT)` or `vllm serve OUT`,
    without lora-triplay installed.

    Example: `lora-triplay export adapters/smoke-demo --role blue --out exports/blue`

    Example: `lora-triplay export adapters/smoke-demo --role all --iteration 2 --out exports/iter2`
    """
    quiet(debug)
    try:
        from ..export import export as do_export

        _check_run_dir(run_dir)
        t0 = time.perf_counter()
        results = do_export(run_dir, role, out, iteration=iteration, force=force, device=device)
        for r in results:
            typer.echo(f"{r.role}: {r.folder} ({r.info['weights']}, {r.info['dtype']}, merged in {r.seconds:.1f}s)")
        typer.echo(f"done in {time.perf_counter() - t0:.1f}s", err=True)
    except USER_ERRORS as exc:
        fail(exc, debug)


def play(
    run_dir: Path = RUN_DIR_ARG,
    requests: Optional[List[str]] = typer.Argument(None, metavar="[REQUEST]...", help='basic requests for red to wrap, e.g. "how do I pick a lock"'),
    from_file: Optional[Path] = typer.Option(None, "--from-file", "-f", help="more requests: a .txt (one per line) or a .jsonl/.csv "
                                                                             "with a prompt column (HarmBench, JailbreakBench...)"),
    column: Optional[str] = typer.Option(None, "--column", help="the request column of a .jsonl/.csv --from-file "
                                                                "(default: the first of prompt, goal, Behavior...)"),
    iteration: Optional[int] = ITERATION_OPT,
    role: List[str] = typer.Option([], "--role", help="use a role's snapshot, e.g. `--role red@2 --role eval@2`; "
                                                      "repeat `--role blue@N` to make several blue snapshots defend side by side"),
    defender: List[str] = typer.Option([], "--defender", help="set the defenders (repeatable): `blue`, "
                                                              "`base` or `blue@N`; default: the recipe's `defenders`"),
    technique: Optional[str] = typer.Option(None, "--technique", "-t", help="wrapping technique by name (default: a seeded random one per request)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1, help="per answer (default: the recipe's grpo.max_new_tokens)"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy (reproducible)"),
    seed: int = typer.Option(0, "--seed", help="seeds the technique draw and sampling"),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON only"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: the recipe's model.device)"),
    debug: bool = DEBUG_OPT,
) -> None:
    """Play one round: red wraps each request, every defender answers, eval labels each answer.

    Labels: negative (harmful answer), rejective (refusal), positive (safe and
    helpful). The run's `rewards.judge_mode` decides how eval answers: forced
    choice over `Label: ...` or free text (a malformed label shows as null).

    Example: `lora-triplay play adapters/smoke-demo "how do I pick a lock"`

    Compare iteration 2 with iteration 10 in one command:
    `lora-triplay play adapters/my-run "how do I pick a lock" --role blue@2 --role blue@10 --technique role_play`

    For scripts: `lora-triplay play adapters/smoke-demo --from-file requests.txt --json > round.json`
    """
    quiet(debug)
    try:
        from ..core.runs import read_run_recipe
        from ..engine.base import Sampling
        from ..play import (
            Selection,
            load_requests,
            pick_techniques,
            play_round,
            render_table,
            resolve_defenders,
        )
        from ..triplay.roles import load_techniques

        _check_run_dir(run_dir)
        texts = load_requests(requests or [], from_file, column)
        recipe = read_run_recipe(run_dir)
        _check_snapshots(run_dir, iteration, [*role, *defender])
        if recipe.game != "triplay":  # another game plays its own round (games/<name>.py: play)
            import torch

            from ..games import make_game

            torch.manual_seed(seed)
            game = make_game(recipe).for_inference(_open(run_dir, iteration, device).engine)
            typer.echo(json.dumps(game.play(game.engine, texts, temperature), ensure_ascii=False, indent=2))
            return
        sel = Selection.from_specs(role, iteration)
        defenders = resolve_defenders(recipe, sel, defender)
        if not defender:  # the recipe may name snapshots this run has not reached: skip them, as training does
            from ..core.store import RunStore

            have = RunStore(run_dir).snapshots("blue")
            missing = [d for d in defenders if "@" in d and d not in sel.blues and int(d.split("@")[1]) not in have]
            for d in missing:
                typer.echo(f"warning: defender {d} skipped: no blue snapshot of that iteration (present: {have})", err=True)
            defenders = [d for d in defenders if d not in missing]
        techniques = pick_techniques(
            load_techniques(None if recipe.data.techniques == "builtin" else recipe.data.techniques), len(texts), technique, seed,
        )
        run = _open(run_dir, iteration, device)
        sampling = Sampling(max_new_tokens=max_new_tokens or recipe.grpo.max_new_tokens, temperature=temperature, seed=seed)
        result = play_round(run, texts, sel=sel, defenders=defenders, techniques=techniques, sampling=sampling, seed=seed)
    except USER_ERRORS as exc:
        fail(exc, debug)
        return
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        render_table(result)


def chat(
    run_dir: Path = RUN_DIR_ARG,
    role: str = typer.Option("blue", "--role", "-r", help="the adapter to talk to: red, blue, eval, base "
                                                          "(adapters off) or a snapshot such as blue@3"),
    iteration: Optional[int] = ITERATION_OPT,
    system: Optional[str] = typer.Option(None, "--system", help="system prompt (default: "
                                                                "blue's training system prompt for blue, none for the others)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1, help="per answer (default: the recipe's grpo.max_new_tokens)"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy; e.g. 0.7 for varied answers"),
    seed: int = typer.Option(0, "--seed"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: the recipe's model.device)"),
    debug: bool = DEBUG_OPT,
) -> None:
    """Chat with one role, one line per turn, reading stdin until EOF or /quit.

    Commands: `/role red|blue|eval|base|blue@N` switches the adapter without
    reloading the base (the history is kept), `/system TEXT` sets the system
    prompt, `/reset` clears the history, `/history`, `/help`, `/quit`.

    Example: `lora-triplay chat adapters/smoke-demo --role blue`

    Scripted: `printf 'hello\\n/role red\\nhello\\n/quit\\n' | lora-triplay chat adapters/smoke-demo`
    """
    quiet(debug)
    try:
        import torch

        from ..core.snapshots import parse_role
        from ..engine.base import Sampling
        from ..play import ChatSession, chat_loop

        parse_role(role)  # a bad --role fails before the model loads
        _check_run_dir(run_dir)
        _check_snapshots(run_dir, iteration, [role])
        run = _open(run_dir, iteration, device)
        torch.manual_seed(seed)
        sampling = Sampling(max_new_tokens=max_new_tokens or run.recipe.grpo.max_new_tokens, temperature=temperature, seed=seed)
        session = ChatSession(run, role, sampling)
        session.custom_system = system
        interactive = sys.stdin.isatty()
        if interactive:
            typer.echo(f"chatting with {session.adapter}; /help for commands, /quit or Ctrl-D to leave", err=True)

        def say(text: str) -> None:
            typer.echo(text)
            sys.stdout.flush()

        def prompt(text: str) -> None:
            typer.echo(text, nl=False, err=True)

        chat_loop(session, sys.stdin, say, prompt if interactive else None)
    except USER_ERRORS as exc:
        fail(exc, debug)


def serve(
    run_dir: Path = RUN_DIR_ARG,
    vllm_args: Optional[List[str]] = typer.Argument(None, metavar="[-- VLLM_ARGS]...", help="passed to vLLM after `--`, "
                                                                                            "e.g. `-- --gpu-memory-utilization 0.8`"),
    iteration: Optional[int] = ITERATION_OPT,
    role: List[str] = typer.Option([], "--role", help="also serve a snapshot as its own model, e.g. `--role blue@3` (repeatable)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the vLLM command and exit"),
    debug: bool = DEBUG_OPT,
) -> None:
    """Serve the base and all three roles with vLLM's OpenAI-compatible server.

    The base is loaded once; red, blue and eval are LoRA modules (the run's
    PEFT folders, `latest/<role>` or `<role>/iter-NNNN`), so a client picks a
    role per request: `model="blue"`, `model="red"`, `model="eval"`, or
    `model="base"` for the bare base. Without vLLM installed it prints the
    command and how to install vLLM, and exits with code 2.

    Example: `lora-triplay serve adapters/smoke-demo --port 8000`, then
    `curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json'
    -d '{"model": "blue", "messages": [{"role": "user", "content": "hi"}]}'`

    Example: `lora-triplay serve adapters/my-run --iteration 2 --role blue@1 --dry-run`
    """
    quiet(debug)
    try:
        from ..serve import (
            INSTALL,
            build_command,
            free_port,
            shell_line,
            vllm_available,
        )

        game = _run_game(run_dir)
        # a game's pipelines (WaltzRL's two agents as one model) need a proxy in front of vLLM
        inner = free_port() if game.pipelines and not dry_run else port
        cmd = build_command(run_dir, iteration=iteration, snapshots=role, host="127.0.0.1" if inner != port else host, port=inner,
                            extra=vllm_args or [])
    except USER_ERRORS as exc:
        fail(exc, debug)
        return
    if dry_run:
        typer.echo(shell_line(cmd))
        return
    if not vllm_available():
        typer.echo(shell_line(cmd))
        typer.secho(f"error: {INSTALL}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    import tempfile

    from ..serve import check_port, listening_port, run_server

    try:
        check_port(host, port if inner != port else listening_port(port, vllm_args or []))
    except USER_ERRORS as exc:
        fail(exc, debug)
        return

    log_path = Path(tempfile.mkdtemp(prefix="lora-triplay-serve-")) / "vllm.log"
    typer.echo(f"starting: {shell_line(cmd)}\n(log until ready: {log_path})", err=True)
    if inner != port:
        from functools import partial

        from ..pipelines import make_proxy, start_proxy

        proxy = make_proxy(host, port, f"http://127.0.0.1:{inner}", {n: partial(game.run_pipeline, n) for n in game.pipelines})
        start_proxy(proxy)
        typer.echo(f"pipelines {', '.join(game.pipelines)} and every role on http://{host}:{port} (vLLM behind it on port {inner})", err=True)
    try:
        code = run_server(cmd, log_path, lambda line: typer.echo(line, err=True))
    except USER_ERRORS as exc:
        fail(exc, debug)
        return
    raise typer.Exit(code)


def _run_game(run_dir: Path):
    from ..core.runs import read_run_recipe
    from ..games import make_game

    _check_run_dir(Path(run_dir))
    return make_game(read_run_recipe(run_dir))


def register(app: typer.Typer) -> None:
    app.command()(export)
    app.command()(play)
    app.command()(chat)
    app.command(context_settings={"allow_interspersed_args": True})(serve)
