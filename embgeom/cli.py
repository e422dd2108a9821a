"""Command-line front end: ``embgeom report``, ``embgeom cram``, ``embgeom copy``.

Argument parsing only, and light: building the parser imports nothing heavy (no torch, numba or
scipy); each sub-command imports its module inside its handler. The work is done by
:mod:`embgeom.report`, :mod:`embgeom.cramming` and :mod:`embgeom.copying`. Bad input (an unknown model, a non-positive count, ``--out`` pointing at
a file, a missing model package) ends with one line on stderr and exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .parallel import add_executor_arguments, executor_from_args

__all__ = ["main", "build_parser"]


class UsageError(ValueError):
    """A command-line argument that cannot be used (reported with exit code 2)."""


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return v


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (v >= 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return v


def _out_dir(text: str) -> Path:
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"--out {text!r} exists and is not a folder")
    return p


def _start_token(text: str):
    """``auto``, ``none`` or a non-negative token id."""
    low = text.strip().lower()
    if low in ("auto", "none"):
        return None if low == "none" else "auto"
    try:
        value = int(low)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected auto, none or a token id, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a token id >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``embgeom`` argument parser (sub-commands ``report``, ``cram``, ``copy``)."""
    parser = argparse.ArgumentParser(
        prog="embgeom",
        description="Embedding-space geometry and the limits it puts on what a language model "
        "can generate.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    rep = sub.add_parser(
        "report",
        help="accessibility report on a model (report.json, report.md, figures)",
        description="Sample hidden states, fit supports, estimate decoder cell volumes and turn "
        "them into packing bounds; writes report.json, report.md and PNG figures into --out.",
    )
    rep.add_argument("--model", default="smollm2-135m",
                     help="registry name (smollm2-135m, gemma-3-270m), a Hugging Face folder or a "
                     ".gguf file (default: smollm2-135m)")
    rep.add_argument("--out", type=_out_dir, default=None,
                     help="output folder (default: reports/<model>)")
    rep.add_argument("--quick", action="store_true",
                     help="small sizes: finishes within about 2 minutes on 2 cores")
    rep.add_argument("--lengths", type=_positive_int, nargs="+", default=None,
                     help="prompt lengths of the random token sequences (tokens)")
    rep.add_argument("--n-per-length", type=_positive_int, default=None,
                     help="hidden states sampled per length")
    rep.add_argument("--cell-samples", type=_positive_int, default=None,
                     help="Monte Carlo samples for the cell volumes")
    rep.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    rep.add_argument("--cache-dir", default=None,
                     help="folder for the .npy cache of hidden states (default: none)")
    rep.add_argument("--cram-summary", default="auto",
                     help="cram_summary.json (or its folder) of an `embgeom cram` run on this model, "
                     "for C_emp; 'auto' (default): the newest under benchmarks/results/ or runs/; "
                     "'none': do not look")
    rep.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_executor_arguments(rep)

    cram = sub.add_parser(
        "cram",
        help="cramming: accessibility vs length, n50 and the empirical slope",
        description="Optimise m memory vectors (soft prompt) on a frozen model so that it emits "
        "random targets; accessibility curves, n50(m) and the slope C_emp.",
    )
    cram.add_argument("--model", default="smollm2-135m")
    cram.add_argument("--mem", type=_positive_int, nargs="+", default=None,
                      help="numbers of memory vectors m to sweep (default: 1)")
    cram.add_argument("--out", type=_out_dir, required=True, help="output folder")
    cram.add_argument("--lengths", type=_positive_int, nargs="+", default=None,
                      help="target lengths (tokens), each run; without it: adaptive search "
                      "(1, 2, 4, ... while accessibility >= 0.5, then bisection)")
    cram.add_argument("--adaptive", action="store_true",
                      help="use --lengths as the coarse grid of the adaptive search")
    cram.add_argument("--n-targets", type=_positive_int, default=None,
                      help="random targets per length (default: 8)")
    cram.add_argument("--steps", type=_positive_int, default=None,
                      help="Adam steps at most (default: 1000)")
    cram.add_argument("--lr", type=_positive_float, default=None,
                      help="Adam learning rate (default: 1e-2)")
    cram.add_argument("--seed", type=int, default=0)
    cram.add_argument("--plot", action="store_true", help="write accessibility and n50 figures")
    cram.add_argument("--device", default=None, help="torch device (default: cpu)")
    cram.add_argument("--start-token", type=_start_token, default="auto",
                      help="token placed before the memory vectors: auto (the tokenizer's BOS), "
                      "none, or a token id")
    cram.add_argument("--precision", choices=("float32", "bf16-autocast"), default=None,
                      help="precision of the model forward while optimising (default: float32); "
                      "bf16-autocast is ~2x faster on a CPU with AVX-512 BF16, every stop and "
                      "verdict is still judged in float32")
    cram.add_argument("--weight-decay", type=_non_negative_float, default=None,
                      help="AdamW weight decay on the memory vectors (default: 0)")
    cram.add_argument("--patience", type=_positive_int, default=None,
                      help="stop a target after this many steps without a new best accuracy "
                      "(default: never)")
    cram.add_argument("--protocol", choices=("paper",), default=None,
                      help="paper: Kuratov et al.'s protocol sized for one 10-minute run on one "
                      "H200 (5000 steps, patience 2000, AdamW lr 1e-2 betas 0.9 0.9 wd 0.01, "
                      "bf16 autocast on cuda, all (m, n) rows in mixed batches; smollm2-135m "
                      "m = 1..4, gemma-3-270m m = 1..2); any option given explicitly overrides "
                      "the preset")
    add_executor_arguments(cram)

    cp = sub.add_parser(
        "copy",
        help="copy task: train a small transformer to copy and find the cliff",
        description="Train a small decoder-only transformer to copy sequences up to --l-train "
        "tokens, evaluate up to 3x that length and locate the accuracy cliff.",
    )
    cp.add_argument("--l-train", type=_positive_int, default=20,
                    help="longest training sequence (tokens)")
    cp.add_argument("--alphabet", type=_positive_int, default=None,
                    help="alphabet size (>= 2)")
    cp.add_argument("--steps", type=_positive_int, default=None, help="training steps")
    cp.add_argument("--out", type=_out_dir, required=True, help="output folder")
    cp.add_argument("--seed", type=int, default=0)
    return parser


def _cmd_report(args) -> dict:
    from .report import build_report

    out = args.out if args.out is not None else Path("reports") / Path(str(args.model)).name
    return build_report(
        args.model,
        out,
        quick=args.quick,
        lengths=args.lengths,
        n_per_length=args.n_per_length,
        n_cell_samples=args.cell_samples,
        seed=args.seed,
        cache_dir=args.cache_dir,
        cram_summary=None if args.cram_summary == "none" else args.cram_summary,
        progress=not args.no_progress,
        executor=executor_from_args(args),
    )


#: ``embgeom cram`` options and their defaults without a protocol.
_CRAM_DEFAULTS = {"mem": [1], "n_targets": 8, "steps": 1000, "lr": 1e-2, "device": "cpu",
                  "precision": "float32", "weight_decay": 0.0, "patience": None}


def _cram_kwargs(args) -> dict:
    """The :func:`run_cram` arguments: the defaults or the ``--protocol`` preset, then every
    option given on the command line."""
    given = {k: getattr(args, k) for k in _CRAM_DEFAULTS if getattr(args, k) is not None}
    if args.protocol is None:
        d = {**_CRAM_DEFAULTS, **given}
        return dict(mems=d["mem"], lengths=args.lengths, n_targets=d["n_targets"],
                    steps=d["steps"], lr=d["lr"], seed=args.seed, plot=args.plot,
                    adaptive=args.lengths is None or args.adaptive, device=d["device"],
                    start_token=args.start_token, precision=d["precision"],
                    weight_decay=d["weight_decay"], patience=d["patience"])
    from ._cram_protocol import paper_protocol, run_cram_kwargs

    if args.adaptive:
        raise UsageError("--adaptive: the paper protocol runs a fixed grid of lengths")
    kw = run_cram_kwargs(paper_protocol(str(args.model)))
    renamed = {"mem": "mems"}
    for k, v in given.items():
        kw[renamed.get(k, k)] = v
    if args.lengths is not None:
        kw["lengths"] = {m: list(args.lengths) for m in kw["mems"]}
    elif "mem" in given:
        missing = [m for m in kw["mems"] if m not in kw["lengths"]]
        if missing:
            raise UsageError(f"--mem {missing}: the paper preset has no lengths for these m; "
                             "give --lengths")
        kw["lengths"] = {m: kw["lengths"][m] for m in kw["mems"]}
    kw["start_token"] = args.start_token  # the preset's is "auto", the flag's default
    overridden = sorted({*given, *(["lengths"] if args.lengths is not None else []),
                         *(["start_token"] if args.start_token != "auto" else [])})
    kw["protocol"] = {**kw["protocol"], "overridden": overridden}
    return dict(kw, seed=args.seed, plot=args.plot)


def _cmd_cram(args) -> dict:
    from ._hf import check_device
    from .cramming import run_cram

    kw = _cram_kwargs(args)
    check_device(kw["device"])  # before the model loads: a bad --device fails at once
    try:
        return run_cram(args.model, kw.pop("mems"), args.out, **kw,
                        executor=executor_from_args(args, device=kw["device"]))
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, NotADirectoryError, FileExistsError)):
            raise  # main reports these in one line already
        # a folder that cannot be written, a full disk: the user's to fix, reported in one line
        detail = exc.strerror or str(exc)
        if exc.filename:
            detail += f": {exc.filename}"
        raise UsageError(detail) from None


def _cmd_copy(args) -> dict:
    from .copying import run_copy

    kw = {}
    if args.alphabet is not None:
        kw["alphabet"] = args.alphabet
    if args.steps is not None:
        kw["steps"] = args.steps
    return run_copy(args.out, l_train=args.l_train, seed=args.seed, **kw)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``embgeom`` console script. Returns the exit code."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # torch's OpenMP threads spin while they wait; passive waits keep a busy machine usable.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"report": _cmd_report, "cram": _cmd_cram, "copy": _cmd_copy}
    try:
        result = handlers[args.command](args)
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError, NotADirectoryError,
            FileExistsError) as exc:
        print(f"embgeom {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("embgeom: interrupted", file=sys.stderr)
        return 130
    if isinstance(result, dict) and result.get("summary_lines"):
        print("\n".join(result["summary_lines"]))
    elif isinstance(result, dict):
        from ._json import dumps

        print(dumps({k: v for k, v in result.items() if k != "summary_lines"}, indent=1)[:4000])
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
