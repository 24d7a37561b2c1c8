"""Command line: `loraserve [serve] [flags]`, `loraserve generate`, `loraserve merge`,
`loraserve ray` (replicas on Ray Serve: `loraserve.cluster.cli`), `loraserve build-kernels`
(compile the C kernels at install)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

COMMANDS = ("serve", "generate", "merge", "ray", "build-kernels")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``loraserve`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from loraserve import logsink

    logsink.install(logging.INFO)  # stderr that nobody reads must not freeze the server
    cmd = argv[0] if argv and argv[0] in COMMANDS else "serve"
    if argv and argv[0] == cmd:
        argv = argv[1:]
    if cmd in ("generate", "ray") and not {"-h", "--help"} & set(argv):
        _prebuild()
    if cmd == "build-kernels":
        build_kernels(argv)
    elif cmd == "generate":
        generate(argv)
    elif cmd == "merge":
        from loraserve.lora.merge_cli import main as merge_main

        merge_main(argv)
    elif cmd == "ray":
        from loraserve.cluster.cli import main as ray_main

        ray_main(argv)
    else:
        from loraserve.server.config.args import parse_server_args
        from loraserve.server.process import serve
        from loraserve.server.vertex import gcp

        cfg = parse_server_args(argv)
        if not cfg.router or gcp.enabled():  # the router runs no kernels: its engines' hosts
            _prebuild()  # build them (~40 ms of the router's start saved)
        serve(cfg)


def _prebuild() -> None:
    """A first start compiles the kernels while torch is imported."""
    from loraserve import cbuild

    cbuild.prebuild()


def build_kernels(argv: list[str]) -> None:
    """``loraserve build-kernels``: compile the C kernels into the package (install time),
    so that no first start waits for the compiler."""
    argparse.ArgumentParser(prog="loraserve build-kernels", description=build_kernels.__doc__
                            ).parse_args(argv)  # fmt: skip
    from loraserve import cbuild

    out = cbuild.build_into_package()
    if out is None:
        logging.getLogger("loraserve").warning(
            "the C kernels could not be built here: loraserve runs on its torch fallback"
        )
        return
    logging.getLogger("loraserve").info("C kernels ready: %s", out)


def generate(argv: list[str]) -> None:
    """``loraserve generate -m MODEL -p PROMPT -n N``: a quick check from the shell."""
    import torch

    from loraserve.engine.engine import Engine, EngineConfig
    from loraserve.engine.sampling.params import SamplingParams
    from loraserve.lora.preflight import PreflightError, preflight
    from loraserve.model.default import resolve_model_path
    from loraserve.model.loader import load_model
    from loraserve.model.recurrent.chunked import CHUNK

    ap = argparse.ArgumentParser(prog="loraserve generate", description=generate.__doc__)
    ap.add_argument("-m", "--model", default=None, help="GGUF file or HF folder (default model)")
    ap.add_argument("-p", "--prompt", required=True)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--temp", type=float, default=0.0, help="default 0: greedy")
    ap.add_argument("--top-k", type=int, default=SamplingParams.top_k)
    ap.add_argument("--top-p", type=float, default=SamplingParams.top_p)
    ap.add_argument("--min-p", type=float, default=SamplingParams.min_p)
    ap.add_argument("--seed", type=int, default=SamplingParams.seed)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument(
        "--dtype",
        choices=("auto", "native", "float32", "int8"),
        default="auto",
        help="weights: native (the file's own formats; auto and int8 mean this) or float32",
    )
    ap.add_argument(
        "--scan-form",
        choices=("recurrent", "chunked"),
        default="recurrent",
        help="gated delta-net and Mamba-2 layers: token by token, or prompts in chunks of 16 "
        "positions (delta-net decode then runs its recurrence)",
    )
    ap.add_argument("--lora", action="append", default=[], metavar="PATH[:SCALE]")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    specs = [_lora_spec(spec) for spec in args.lora]
    path = resolve_model_path(args.model)
    try:  # headers only: a bad file is reported before the weights load
        preflight(path, [p for p, _ in specs])
    except PreflightError as e:
        ap.error(str(e))
    chunk = CHUNK if args.scan_form == "chunked" else 0
    model = load_model(path, "float32" if args.dtype == "float32" else "native", chunk)
    engine = Engine(model, EngineConfig(n_ctx=min(model.config.context_length, 8192)))
    for lora, scale in specs:  # each at its global scale: the request runs under the global map
        try:
            engine.load_adapter(lora, scale).result()
        except ValueError as e:  # AdapterError
            ap.error(f"--lora {lora}: {e}")
    sp = SamplingParams(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed
    )
    try:
        sp.validate(model.config.vocab_size)
    except ValueError as e:
        ap.error(str(e))
    tok = model.tokenizer
    t0 = time.perf_counter()
    (req,) = engine.submit([tok.encode(args.prompt)], sp, max_tokens=args.n_predict).requests
    sys.stdout.write(args.prompt)
    while True:
        engine.step()
        while not req.events.empty():
            ev = req.events.get()
            sys.stdout.write(ev.text)
            sys.stdout.flush()
            if ev.done:
                t = ev.timings
                sys.stdout.write("\n")
                if t is not None:
                    print(
                        f"[prompt {t.prompt_n} tok, {t.prompt_ms:.0f} ms; generated "
                        f"{t.predicted_n} tok, {t.predicted_ms:.0f} ms; total "
                        f"{time.perf_counter() - t0:.2f} s]",
                        file=sys.stderr,
                    )
                return


def _lora_spec(spec: str) -> tuple[str, float]:
    """`PATH[:SCALE]` of `generate --lora` (scale 1 by default)."""
    path, sep, scale = spec.rpartition(":")
    if not sep or not path:
        return spec, 1.0
    try:
        return path, float(scale)
    except ValueError:
        raise SystemExit(f"loraserve generate: --lora {spec}: the scale must be a number") from None


if __name__ == "__main__":
    main()
