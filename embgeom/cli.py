"""Command-line front end: ``embgeom report``, ``embgeom cram``, ``embgeom copy``.

Argument parsing only, and light: building the parser imports nothing heavy (no torch, numba,
scipy or numpy); each sub-command imports its module inside its handler. The work is done by
:mod:`embgeom.report`, :mod:`embgeom.cramming` and :mod:`embgeom.copying`.

Errors, in three kinds:

- bad input ends with one line on stderr that names the flag, and exit code 2, no traceback.
  By kind: a value embgeom refuses (an unknown model, a non-positive count, a seed outside
  ``[0, 2**63)``, Ray resources that are not positive numbers); a model folder or file that
  cannot be loaded (:func:`embgeom.adapters.load_model` names ``--model`` and the loader's
  reason); a file named on the command line, or a resume file in ``--out``, that is not UTF-8
  text; ``--out`` that cannot be written and any ``OSError`` such as a full disk; a missing
  package; sizes that need more memory than the machine has (the message names the size
  flags of the command). Output folders and resume files are checked before any model is
  loaded;
- when, by kind: what needs no model is refused by the parser (``argument --FLAG: expected
  <what>, got '<text>'``, one style for a word and for a number out of range), counts above a
  cap that only an accident reaches included (``--cell-samples`` at most 2**34, the library's
  ``MAX_SAMPLES``; ``--n-per-length``, ``--n-targets`` at most 2**20; the step counts at most
  2**30); what needs the model (``--start-token`` against its vocabulary; ``--lengths``,
  ``--mem``, ``--max-length`` against its context length) right after it loads (the library
  entry points' ``on_load`` hook), before
  ``--out`` is created; and a run that fails anyway removes the ``--out`` (and
  ``--cache-dir``) folders it created while they are still empty, never a folder that existed
  before or holds anything;
- an internal error (an exception that embgeom did not raise on purpose: a bug) ends with one
  line that says so and exit code 1; ``--debug`` shows its traceback (and that of any error);
- Ctrl-C ends with exit code 130.

Every sub-command takes ``-q/--quiet``, ``-v/--verbose``, ``--no-progress`` and ``--debug``.
Progress bars are drawn only when stderr is a terminal. Results go to files (JSON plus a
readable table); the terminal gets a short summary and the files' paths.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

__all__ = ["main", "build_parser"]

_log = logging.getLogger("embgeom.cli")


class UsageError(ValueError):
    """A command-line argument that cannot be used (reported with exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors on one line: ``embgeom cram: error: argument --seed:
    ...`` and where to find the usage, instead of the usage block above the message."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} "
                     "--help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: ...)`` after each option's help, except where the default is ``None``
    or ``False`` (the help text says what happens then)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or isinstance(
                action, argparse._CountAction):
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    from . import __version__

    return __version__


def _shown(text: str) -> str:
    """``text`` as an error message quotes it: ``repr``, cut to 40 characters (a 5,000-digit
    number would otherwise fill the terminal)."""
    if len(text) > 40:
        text = f"{text[:24]}... ({len(text)} characters)"
    return repr(text)


def _int_type(low: int, high: int | None = None, what: str | None = None):
    """An argparse ``type=``: an integer in ``[low, high]`` (no upper bound for ``high=None``).

    Every refusal, of a word (``1.5``, ``abc``) as of a number out of range (``0``, ``-1``,
    ``1e29``-sized), is the one message ``expected <what>, got '<text as typed>'``; ``what``
    defaults to ``a positive integer [<= high]``, ``an integer >= low`` or ``an integer in
    [low, high]``.
    """
    if what is None and low == 1:
        what = "a positive integer" + ("" if high is None else f" <= {_power_of_two(high)}")
    elif what is None:
        what = (f"an integer >= {low}" if high is None
                else f"an integer in [{low}, {_power_of_two(high)}]")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # a word, a fraction, or more digits than Python converts
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {_shown(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def _power_of_two(n: int) -> str:
    """``2**34`` for 17179869184 (how the caps are written in the help), else ``str(n)``."""
    return f"2**{n.bit_length() - 1}" if n > 1024 and n & (n - 1) == 0 else str(n)


_positive_int = _int_type(1)

#: Caps of the counts whose value can only be an accident above them (each flag's help says
#: its cap). The lengths and ``--mem`` have no fixed cap: the model's context length bounds
#: them, checked right after the model loads (:func:`_check_cram_against_model`).
#:
#: ``--cell-samples``: :data:`embgeom.volumes.MAX_SAMPLES`, the library's own cap (2**34,
#: about 1,000 CPU-hours at SmolLM2's size), written out so that the parser imports nothing
#: heavy (tests/test_cli_early_errors.py checks that the two agree).
CELL_SAMPLES_LIMIT = 2**34
#: ``--n-per-length``: hidden states per prompt length (the paper drew 10,000 on a GPU; 2**20
#: per length are 2.4 GB of SmolLM2 states each, beyond this kind of machine for 7 lengths).
PER_LENGTH_LIMIT = 2**20
#: ``--n-targets``: random targets per length, each its own optimisation (default 8 or 16).
TARGETS_LIMIT = 2**20
#: ``--steps``, ``--patience``, ``--steps-per-length``, ``--max-steps``: optimiser updates
#: (2**30 at a millisecond each are 12 days for one target).
STEPS_LIMIT = 2**30


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
    if not text.strip():  # Path("") is the current folder: never what an empty value meant
        raise argparse.ArgumentTypeError("expected a folder path, got an empty string")
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
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


#: seeds are passed to numpy and torch with small offsets added (seed + 1, per-stream keys);
#: below 2**63 every one of them is a valid int64/uint64 entropy word
_SEED_LIMIT = 2**63


_seed = _int_type(0, _SEED_LIMIT - 1, what="an integer in [0, 2**63)")


def _common_options() -> argparse.ArgumentParser:
    """The options every sub-command takes (a parent parser)."""
    common = _Parser(add_help=False)
    g = common.add_argument_group("output and diagnostics")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="print only errors and the final summary: no progress bars, no "
                   "warnings, no log messages")
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="more log messages on stderr: -v every info message, -vv debug too "
                   "(default: warnings, and the info lines that say where the model and the "
                   "hidden states came from; for report also its phase lines when no progress "
                   "bar is drawn)")
    g.add_argument("--no-progress", action="store_true",
                   help="hide progress bars (they are drawn only when stderr is a terminal)")
    g.add_argument("--debug", action="store_true",
                   help="show the full traceback of any error instead of one line")
    return common


#: The names of :data:`embgeom.cramming.PROTOCOLS` and its default, written out so that
#: ``embgeom --help`` imports nothing heavy (tests/test_cli.py checks them against the presets).
CRAM_PROTOCOL_NAMES = ("adam", "cosine", "kuratov", "lbfgs", "lowrank", "paper", "progressive",
                       "restarts", "whitened")
CRAM_DEFAULT_PROTOCOL = "progressive"


def build_parser(*, executor_flags: bool = True) -> argparse.ArgumentParser:
    """The ``embgeom`` argument parser (sub-commands ``report``, ``cram``, ``copy``).

    Parameters
    ----------
    executor_flags : bool, default True
        Add ``--executor`` and the Ray flags (:func:`embgeom.parallel.add_executor_arguments`)
        to ``report`` and ``cram``. That imports numpy; :func:`main` leaves them out when the
        command line names neither command (``embgeom --help``, ``embgeom --version``), which
        keeps those instant.

    Returns
    -------
    argparse.ArgumentParser
    """
    if executor_flags:
        from .parallel import add_executor_arguments
    else:
        def add_executor_arguments(parser, **kw):
            return None

    parser = _Parser(
        prog="embgeom",
        description="Embedding-space geometry and the limits it puts on what a language model "
        "can generate.",
        epilog="Run 'embgeom COMMAND --help' for the options of a command.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_options()

    def command(name, **kw):
        return sub.add_parser(name, parents=[common], formatter_class=_HelpFormatter, **kw)

    _add_report_command(command, add_executor_arguments)
    _add_cram_command(command, add_executor_arguments)
    _add_copy_command(command)
    return parser


def _add_report_command(command, add_executor_arguments) -> None:
    """``embgeom report``: its options (one ``add_argument`` per flag)."""
    rep = command(
        "report",
        help="accessibility report on a model (report.json, report.md, figures)",
        description="Sample hidden states, fit supports, estimate decoder cell volumes and turn "
        "them into packing bounds; writes report.json, report.md and PNG figures into --out.",
    )
    rep.add_argument("--model", default="smollm2-135m",
                     help="registry name (smollm2-135m, gemma-3-270m), a Hugging Face folder or a "
                     ".gguf file")
    rep.add_argument("--out", type=_out_dir, default=None,
                     help="output folder (default: reports/<model>)")
    rep.add_argument("--quick", action="store_true",
                     help="small sizes: finishes within about 2 minutes on 2 cores")
    rep.add_argument("--lengths", type=_positive_int, nargs="+", default=None,
                     help="prompt lengths of the random token sequences, in tokens, each at "
                     "most the model's context length (default: the size preset's, see "
                     "docs/report.md)")
    rep.add_argument("--n-per-length", type=_int_type(2, PER_LENGTH_LIMIT), default=None,
                     help="hidden states sampled per length, 2 to "
                     f"{_power_of_two(PER_LENGTH_LIMIT)} (default: the size preset's)")
    rep.add_argument("--cell-samples", type=_int_type(1, CELL_SAMPLES_LIMIT), default=None,
                     help="Monte Carlo points for the cell volumes, at most "
                     f"{_power_of_two(CELL_SAMPLES_LIMIT)} (default: the size preset's)")
    rep.add_argument("--seed", type=_seed, default=0,
                     help="seed of every random draw (an integer >= 0); the held-out check uses "
                     "seed + 1")
    cache = rep.add_mutually_exclusive_group()
    cache.add_argument("--cache-dir", type=_out_dir, default=None,
                       help="folder for the cache of the sampled hidden states (default: "
                       "$EMBGEOM_CACHE, else $XDG_CACHE_HOME/embgeom, else ~/.cache/embgeom; "
                       "a second run with the same model and sizes skips the sampling)")
    cache.add_argument("--no-cache", action="store_true",
                       help="neither read nor write cached hidden states")
    rep.add_argument("--cram-summary", default="auto",
                     help="cram_summary.json (or its folder) of an `embgeom cram` run on this model, "
                     "for C_emp; 'auto': the best under benchmarks/results/ or runs/ (horizons over "
                     "per-length runs, random tokens over words, more m, more targets; newer on "
                     "ties); 'none': do not look")
    rep.add_argument("--all-cells", default="auto", metavar="NPZ",
                     help="a file of every token's cell share (benchmarks/all_cells.py) for lambda "
                     "from all tokens and the smallest and largest cells; 'auto': the files under "
                     "benchmarks/results/all_cells/ (used when made for this model and support); "
                     "'none': do not look")
    add_executor_arguments(rep)


def _add_cram_command(command, add_executor_arguments) -> None:
    """``embgeom cram``: its options, per-length and ``--horizons``."""
    cram = command(
        "cram",
        help="cramming: accessibility vs length, n50 and the empirical slope",
        description="Optimise m memory vectors (soft prompt) on a frozen model so that it emits "
        "random targets; accessibility curves, n50(m) and the slope C_emp. Writes cram.jsonl "
        "(resumable), cram_summary.json and cram_summary.md into --out.",
    )
    cram.add_argument("--model", default="smollm2-135m",
                      help="registry name (smollm2-135m, gemma-3-270m), a Hugging Face folder or "
                      "a .gguf file")
    cram.add_argument("--mem", type=_positive_int, nargs="+", default=None,
                      help="numbers of memory vectors m to sweep; the start token, m vectors and "
                      "the target must fit the model's context length (default: 1)")
    cram.add_argument("--out", type=_out_dir, required=True, help="output folder")
    cram.add_argument("--lengths", type=_positive_int, nargs="+", default=None,
                      help="target lengths (tokens), each run, each fitting the model's context "
                      "length after the start token and m vectors; without it: adaptive search "
                      "(1, 2, 4, ... while accessibility >= 0.5, then bisection)")
    cram.add_argument("--adaptive", action="store_true",
                      help="use --lengths as the coarse grid of the adaptive search")
    cram.add_argument("--n-targets", type=_int_type(1, TARGETS_LIMIT), default=None,
                      help=f"random targets per length, at most {_power_of_two(TARGETS_LIMIT)} "
                      "(default: 8)")
    cram.add_argument("--steps", type=_int_type(1, STEPS_LIMIT), default=None,
                      help=f"Adam steps at most, up to {_power_of_two(STEPS_LIMIT)} (default: "
                      "1000)")
    cram.add_argument("--lr", type=_positive_float, default=None,
                      help="Adam learning rate (default: 1e-2)")
    cram.add_argument("--seed", type=_seed, default=0,
                      help="seed of the targets and the memory vectors' initialisation (an "
                      "integer >= 0)")
    cram.add_argument("--plot", action="store_true", help="write accessibility and n50 figures")
    cram.add_argument("--device", default=None,
                      help="torch device (cpu, cuda, cuda:1, ...; default: cpu)")
    cram.add_argument("--start-token", type=_start_token, default="auto",
                      help="token placed before the memory vectors: auto (the tokenizer's BOS), "
                      "none, or a token id of the model's vocabulary")
    cram.add_argument("--precision", choices=("float32", "bf16-autocast", "bf16-linear"), default=None,
                      help="precision of the model forward while optimising (default: float32); "
                      "bf16-autocast is ~2x faster on a CPU with AVX-512 BF16, bf16-linear (bf16 linear layers, the rest float32) 1.6x on one with AMX; every stop and "
                      "verdict is still judged in float32")
    cram.add_argument("--weight-decay", type=_non_negative_float, default=None,
                      help="AdamW weight decay on the memory vectors (default: 0)")
    cram.add_argument("--patience", type=_int_type(1, STEPS_LIMIT), default=None,
                      help="stop a target after this many steps without a new best accuracy, at "
                      f"most {_power_of_two(STEPS_LIMIT)} (default: never)")
    cram.add_argument("--protocol", choices=CRAM_PROTOCOL_NAMES, default=None,
                      help="the optimiser preset. With --horizons: any of the choices "
                      f"(default {CRAM_DEFAULT_PROTOCOL}; docs/cramming.md lists each with its "
                      "source). Without --horizons (per-length runs) only 'paper' is accepted: "
                      "Kuratov et al.'s protocol sized for one 10-minute run on one H200 (5000 "
                      "steps, patience 2000, AdamW lr 1e-2 betas 0.9 0.9 wd 0.01, bf16 autocast "
                      "on cuda, all (m, n) rows in mixed batches; smollm2-135m m = 1..4, "
                      "gemma-3-270m m = 1..2; an option given explicitly overrides the preset)")
    cram.add_argument("--horizons", action="store_true",
                      help="progressive cramming: one run per target grows it token by token "
                      "from the previous solution and records its horizon h (longest crammed "
                      "prefix); accessibility(n) = P(h >= n), n50 = median horizon. Writes "
                      "horizons.jsonl (resumable) and the same cram_summary.json")
    cram.add_argument("--steps-per-length", type=_int_type(1, STEPS_LIMIT), default=None,
                      help="with --horizons: updates allowed for each new length, at most "
                      f"{_power_of_two(STEPS_LIMIT)} (default 500)")
    cram.add_argument("--max-steps", type=_int_type(1, STEPS_LIMIT), default=None,
                      help="with --horizons: cap on a target's updates in all, at most "
                      f"{_power_of_two(STEPS_LIMIT)} (default: none)")
    cram.add_argument("--max-length", type=_positive_int, default=None,
                      help="with --horizons: the longest prefix tried; the start token, m "
                      "vectors and the prefix must fit the model's context length (default 64)")
    cram.add_argument("--target-source", choices=("random-tokens", "wordlist", "words"),
                      default="random-tokens",
                      help="random-tokens (the theorem's count), wordlist (the paper's "
                      "random text: random words of a 100k-word English list), words (random "
                      "whole-word tokens)")
    add_executor_arguments(cram, n_jobs=1, device_option="--device")


def _add_copy_command(command) -> None:
    """``embgeom copy``: its options."""
    cp = command(
        "copy",
        help="copy task: train a small transformer to copy and find the cliff",
        description="Train a small decoder-only transformer to copy sequences up to --l-train "
        "tokens, evaluate up to 3x that length and locate the accuracy cliff. Writes "
        "copy_summary.json, copy_accuracy.png and checkpoint/ into --out.",
    )
    cp.add_argument("--l-train", type=_positive_int, default=20,
                    help="longest training sequence (tokens)")
    cp.add_argument("--alphabet", type=_int_type(2), default=16, help="alphabet size (>= 2)")
    cp.add_argument("--steps", type=_int_type(1, STEPS_LIMIT), default=2000,
                    help=f"training steps, at most {_power_of_two(STEPS_LIMIT)}")
    cp.add_argument("--out", type=_out_dir, required=True, help="output folder")
    cp.add_argument("--seed", type=_seed, default=0,
                    help="master seed: initialisation, training and evaluation data get "
                    "independent streams derived from it (an integer >= 0)")


# --------------------------------------------------------------------------------------------
# Checks before any work
# --------------------------------------------------------------------------------------------


def _check_output_folder(path: Path, flag: str) -> None:
    """Fail now, with one line, when ``path`` cannot become a writable folder.

    Creates nothing: probes the folder (or, when it does not exist yet, its nearest existing
    parent, where it would be created) with a temporary file that is removed at once.
    """
    probe = Path(path).expanduser()
    try:
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if not probe.is_dir():
            raise UsageError(f"{flag}: {probe} is a file, so {path} cannot be a folder")
        with tempfile.TemporaryFile(dir=probe):
            pass
    except UsageError:
        raise
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag}: cannot write into {probe} ({why})") from None


def _check_text_file(path: Path, flag: str, what: str) -> None:
    """Fail now, with one line, when the existing file ``path`` is not UTF-8 text.

    The readers behind the flags (JSON, JSONL) would otherwise raise a ``UnicodeDecodeError``
    that names no file, deep into the run.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            while fh.read(1 << 20):
                pass
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag}: {path} is not UTF-8 text (byte {exc.start}: {exc.reason}), so "
                         f"it is not {what}") from None
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path} ({exc.strerror or type(exc).__name__})") from None


@contextlib.contextmanager
def _remove_if_left_empty(*folders):
    """Folders among ``folders`` (and their parents) that do not exist now are removed again
    when the block fails and leaves them empty: a refused or failed run leaves no empty
    ``--out`` behind. A folder that existed before, or holds anything (a resume file, a
    figure), is never removed."""
    new = []
    for folder in folders:
        if folder is None:
            continue
        path = Path(folder).expanduser().absolute()
        chain = []  # the deepest first, up to the first folder that exists
        while not os.path.lexists(path) and path.parent != path:
            chain.append(path)
            path = path.parent
        new.append(chain)
    try:
        yield
    except BaseException:
        for chain in new:
            for path in chain:
                try:
                    path.rmdir()  # only an empty folder
                except FileNotFoundError:  # not made (or made and removed): its parent may be
                    continue
                except OSError:  # not empty, or not ours to remove: the parents stay too
                    break
        raise


def _context_length(loaded) -> tuple:
    """``(hf model, tokenizer, name, context length or None)`` of a loaded model."""
    from ._hf import max_positions, unwrap

    hf, tokenizer, name, _ = unwrap(loaded)
    return hf, tokenizer, name, max_positions(hf)


def _check_report_against_model(lengths, *, given: bool = True):
    """The check of ``embgeom report`` after the load: every prompt length (``--lengths``, or
    the size preset's: ``given=False``) within the model's context length."""

    def check(loaded) -> None:
        _, _, name, limit = _context_length(loaded)
        too_long = [n for n in lengths if limit is not None and n > limit]
        if too_long:
            whose = "" if given else " (the size preset's)"
            raise UsageError(f"--lengths {' '.join(map(str, too_long))}{whose}: longer than the "
                             f"context length of {name} ({limit} tokens); give lengths <= "
                             f"{limit}")

    return check


def _check_cram_against_model(mems, longest, start_token, length_flag: str):
    """The check of ``embgeom cram`` after the load: ``--start-token`` a token id of the model,
    and for every m the start token, m memory vectors and the longest target within the
    context length (``longest``: {m: length}; the library's count, the last target token is
    never fed: ``start + m + n - 1`` positions)."""

    def check(loaded) -> None:
        from ._hf import resolve_start_token, vocab_rows

        hf, tokenizer, name, limit = _context_length(loaded)
        vocab = vocab_rows(hf)
        if isinstance(start_token, int) and start_token >= vocab:
            raise UsageError(f"--start-token {start_token}: not a token id of {name} (its ids "
                             f"are 0 to {vocab - 1}); give one of them, auto or none")
        if limit is None:
            return
        start = int(resolve_start_token(hf, tokenizer, start_token, vocab) is not None)
        for m in sorted(mems):
            prefix = (f"{'1 start token' if start else 'no start token'} + {m} memory "
                      f"vector{'s' if m != 1 else ''}")
            if start + m > limit:
                raise UsageError(
                    f"--mem {m}: {prefix} leave no room for a target in the context length of "
                    f"{name} ({limit} tokens); give --mem <= {limit - start}")
            n = longest[m]
            if start + m + n - 1 > limit:
                raise UsageError(
                    f"{length_flag} {n}: {prefix} + a {n}-token target take "
                    f"{start + m + n - 1} positions, more than the context length of {name} "
                    f"({limit} tokens); with --mem {m} the longest target that fits is "
                    f"{limit - start - m + 1}")

    return check


def _progress(args) -> bool:
    from ._progress import progress_enabled

    return progress_enabled(not (args.no_progress or args.quiet))


def _executor(args, device=None):
    """The executor of the --executor/--n-jobs flags, or None for a serial local run."""
    from .parallel import executor_from_args

    try:
        ex = executor_from_args(args, device=device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.executor == "local":
        return None if ex.n_workers == 1 else ex
    try:  # connect now, before the model loads: a wrong address fails in seconds, not minutes
        ex.start()
    except Exception as exc:  # Ray's ConnectionError and friends: the address is the user's
        raise UsageError(f"--ray-address: cannot connect to the Ray cluster ({exc})") from None
    return ex


def _pass_executor(func, kwargs: dict, executor) -> None:
    """Add ``executor=`` to ``kwargs`` when ``func`` takes it; refuse --executor ray otherwise
    (a local pool is then left out: the function runs in this process)."""
    if executor is None:
        return
    import inspect

    from .parallel import LocalExecutor

    if "executor" not in inspect.signature(func).parameters:
        if isinstance(executor, LocalExecutor):
            return
        raise UsageError(f"--executor ray: {func.__module__}.{func.__name__} does not run on an "
                         "executor yet; use --executor local")
    kwargs["executor"] = executor


# --------------------------------------------------------------------------------------------
# Sub-commands
# --------------------------------------------------------------------------------------------


def _cmd_report(args) -> dict:
    out = args.out if args.out is not None else Path("reports") / Path(str(args.model)).name
    _check_output_folder(out, "--out")
    if args.cache_dir is not None:
        _check_output_folder(args.cache_dir, "--cache-dir")
    elif not args.no_cache and os.environ.get("EMBGEOM_CACHE"):
        # the default cache folder, named by the environment: the same check as --cache-dir
        _check_output_folder(Path(os.environ["EMBGEOM_CACHE"]).expanduser() / "hidden_states",
                             "EMBGEOM_CACHE")
    if args.cram_summary not in ("auto", "none"):
        given = Path(args.cram_summary).expanduser()
        summary = given / "cram_summary.json" if given.is_dir() else given
        if summary.is_file():
            _check_text_file(summary, "--cram-summary", "an `embgeom cram` summary")
    if args.all_cells not in ("auto", "none") and not Path(args.all_cells).expanduser().is_file():
        raise UsageError(f"--all-cells: no such file {args.all_cells} (a .npz of "
                         "benchmarks/all_cells.py; 'auto' or 'none')")
    executor = _executor(args)
    from .report import build_report

    kw = dict(quick=args.quick, lengths=args.lengths, n_per_length=args.n_per_length,
              n_cell_samples=args.cell_samples, seed=args.seed,
              cache_dir=None if args.no_cache else (args.cache_dir or "auto"),
              cram_summary=None if args.cram_summary == "none" else args.cram_summary,
              vocabulary=None if args.all_cells == "none" else args.all_cells,
              progress=_progress(args))
    _pass_executor(build_report, kw, executor)
    _log.info("report on %s into %s", args.model, out)
    from .report import REPORT_SIZES

    lengths = args.lengths or REPORT_SIZES["quick" if args.quick else "default"]["lengths"]
    with _remove_if_left_empty(out, args.cache_dir):
        return build_report(args.model, out, **kw, on_load=_check_report_against_model(
            lengths, given=args.lengths is not None))


#: ``embgeom cram`` options and their defaults without a protocol.
_CRAM_DEFAULTS = {"mem": [1], "n_targets": 8, "steps": 1000, "lr": 1e-2, "device": "cpu",
                  "precision": "float32", "weight_decay": 0.0, "patience": None}


def _cram_kwargs(args) -> dict:
    """The :func:`run_cram` arguments: the defaults or the ``--protocol`` preset, then every
    option given on the command line."""
    given = {k: getattr(args, k) for k in _CRAM_DEFAULTS if getattr(args, k) is not None}
    if args.adaptive and args.lengths is None and args.protocol is None:
        # without --lengths the search is adaptive already: the flag would change nothing
        raise UsageError("--adaptive: needs --lengths (the coarse grid of the adaptive search); "
                         "without --lengths the search is adaptive already")
    if args.protocol is None:
        d = {**_CRAM_DEFAULTS, **given}
        return dict(mems=d["mem"], lengths=args.lengths, n_targets=d["n_targets"],
                    steps=d["steps"], lr=d["lr"], seed=args.seed, plot=args.plot,
                    adaptive=args.lengths is None or args.adaptive, device=d["device"],
                    start_token=args.start_token, precision=d["precision"],
                    weight_decay=d["weight_decay"], patience=d["patience"])
    if args.adaptive:
        raise UsageError("--adaptive: the paper protocol runs a fixed grid of lengths")
    from .cramming._gpu_protocol import paper_protocol, run_cram_kwargs

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


_HORIZON_ONLY = ("steps_per_length", "max_steps", "max_length")


def _horizons_kwargs(args) -> dict:
    """The :func:`run_horizons` arguments of ``embgeom cram --horizons``."""
    from .cramming._protocols import DEFAULT_PROTOCOL

    for flag in ("lengths", "steps", "lr", "weight_decay", "patience"):
        if getattr(args, flag) not in (None, False):
            raise UsageError(f"--{flag.replace('_', '-')}: not an option of --horizons (the "
                             "optimiser is --protocol, the budget --steps-per-length)")
    if args.adaptive:
        raise UsageError("--adaptive: not an option of --horizons (every length is tried in turn)")
    return dict(mems=args.mem or [1], n_targets=args.n_targets or 16,
                max_length=args.max_length or 64, target_source=args.target_source,
                protocol=args.protocol or DEFAULT_PROTOCOL,
                steps_per_length=args.steps_per_length or 500, max_steps=args.max_steps,
                seed=args.seed, plot=args.plot, start_token=args.start_token,
                precision=args.precision or "float32", device=args.device)


def _cmd_cram(args) -> dict:
    _check_output_folder(args.out, "--out")
    if args.horizons:
        return _cmd_horizons(args)
    for flag in _HORIZON_ONLY:
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')}: only with --horizons")
    if args.protocol not in (None, "paper"):
        raise UsageError(f"--protocol {args.protocol}: per-length runs take only 'paper'; the "
                         "optimiser presets run with --horizons")
    resume = Path(args.out).expanduser() / "cram.jsonl"
    if resume.is_file():  # a run resumes from it: a foreign file fails now, not after the load
        _check_text_file(resume, "--out", "a cram.jsonl of `embgeom cram` (move it away or "
                         "choose another --out)")
    from ._hf import check_device

    kw = _cram_kwargs(args)
    check_device(kw["device"])  # before the model loads: a bad --device fails at once
    executor = _executor(args, device=kw["device"])
    from .cramming import run_cram

    kw["progress"] = _progress(args)
    _pass_executor(run_cram, kw, executor)
    mems = kw.pop("mems")
    _log.info("cramming %s with m in %s into %s", args.model, mems, args.out)
    kw["target_source"] = args.target_source
    lengths = kw["lengths"]
    longest = {m: max(lengths[m] if isinstance(lengths, dict) else lengths or [1]) for m in mems}
    with _remove_if_left_empty(args.out):
        return run_cram(args.model, mems, args.out, **kw, on_load=_check_cram_against_model(
            mems, longest, args.start_token, "--lengths"))


def _cmd_horizons(args) -> dict:
    resume = Path(args.out).expanduser() / "horizons.jsonl"
    if resume.is_file():
        _check_text_file(resume, "--out", "a horizons.jsonl of `embgeom cram --horizons` (move "
                         "it away or choose another --out)")
    from ._hf import check_device

    kw = _horizons_kwargs(args)
    check_device(kw["device"])
    from .cramming import run_horizons

    kw["progress"] = _progress(args)
    mems = kw.pop("mems")
    _log.info("horizons of %s with m in %s (%s) into %s", args.model, mems, kw["protocol"],
              args.out)
    with _remove_if_left_empty(args.out):
        return run_horizons(args.model, mems, args.out, **kw, on_load=_check_cram_against_model(
            mems, {m: kw["max_length"] for m in mems}, args.start_token, "--max-length"))


def _cmd_copy(args) -> dict:
    _check_output_folder(args.out, "--out")
    from .copying import run_copy

    _log.info("copy task, l_train %d, into %s", args.l_train, args.out)
    with _remove_if_left_empty(args.out):
        return run_copy(args.out, l_train=args.l_train, alphabet=args.alphabet, steps=args.steps,
                        seed=args.seed, progress=_progress(args))


def _copy_lines(res: dict) -> list[str]:
    """A short readable table of ``run_copy``'s summary (the full one is copy_summary.json)."""
    cfg = res.get("config", {})
    ev = res.get("evaluation", {})
    lines = [f"copy task: alphabet {cfg.get('alphabet')}, trained on lengths <= "
             f"{cfg.get('l_train')}, {cfg.get('steps')} steps, seed {cfg.get('seed')}"]
    lengths, acc = ev.get("lengths"), ev.get("exact_match")
    if lengths and acc:
        lines.append("  length  exact match")
        step = max(1, len(lengths) // 12)
        for i in range(0, len(lengths), step):
            lines.append(f"  {int(lengths[i]):6d}  {float(acc[i]):.3f}")
    interval = res.get("cliff_interval")
    lines.append(f"  cliff: {res.get('cliff')}" + (f" (interval {interval})" if interval else ""))
    if res.get("bounds_note"):
        lines.append(f"  {res['bounds_note']}")
    if res.get("wall_s") is not None:
        lines.append(f"  {float(res['wall_s']):.0f} s")
    return lines


def _print_result(command: str, result) -> None:
    if not isinstance(result, dict):
        return
    if result.get("summary_lines"):
        lines = list(result["summary_lines"])
    elif command == "copy":
        lines = _copy_lines(result)
    else:
        lines = [f"embgeom {command}: done"]
    files = result.get("files") or {}
    summary = files.get("summary") or files.get("summary_json")
    if summary and not any(str(summary) in line for line in lines):
        lines.append(f"full results: {summary}")
    print("\n".join(lines))


# --------------------------------------------------------------------------------------------
# Errors and the entry point
# --------------------------------------------------------------------------------------------

_PACKAGE_DIR = Path(__file__).resolve().parent


def _raised_on_purpose(exc: BaseException) -> bool:
    """Whether embgeom raised ``exc`` itself, with a ``raise`` statement (an input check).

    A ``ValueError``/``TypeError`` that comes out of numpy, torch or scipy, or out of an
    expression in embgeom's own code (``None + 1``), is a bug, not bad input.
    """
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = Path(tb.tb_frame.f_code.co_filename).resolve()
    if _PACKAGE_DIR not in filename.parents:
        return False
    import linecache

    return linecache.getline(str(filename), tb.tb_lineno).lstrip().startswith("raise")


#: library argument names that a command-line flag of another name sets
_FLAG_OF_LIBRARY_NAME = {"name_or_path": "model", "mems": "mem", "n_cell_samples": "cell_samples",
                         "n_samples": "cell_samples",
                         "n_targets": "n_targets", "out_dir": "out", "num_cpus": "ray_num_cpus",
                         "num_gpus": "ray_num_gpus", "address": "ray_address"}

#: the flags that set how much memory a command needs, named when it runs out
_SIZE_FLAGS = {"report": "--lengths, --n-per-length, --cell-samples",
               "cram": "--mem, --lengths, --n-targets",
               "copy": "--alphabet, --l-train"}

#: the flags that name files a command reads, named when one is not text
_FILE_FLAGS = {"report": "--model, --cram-summary, --cache-dir", "cram": "--model, --out",
               "copy": "--out"}


def _in_flag_terms(message: str, parser: argparse.ArgumentParser, command: str) -> str:
    """A library error that starts with an argument name (``n_per_length: ...``), reworded with
    the flag the user typed (``--n-per-length: ...``); other messages unchanged."""
    import re

    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?=[:=])", message)
    if not m:
        return message
    name = _FLAG_OF_LIBRARY_NAME.get(m.group(1), m.group(1))
    try:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        actions = sub.choices[command]._actions
    except (StopIteration, KeyError, AttributeError):  # pragma: no cover - argparse internals
        return message
    for action in actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if action.dest == name and longs:
            return longs[0] + message[m.end():]
    return message


def _out_of_memory(exc: BaseException) -> bool:
    """``MemoryError`` (numpy's too), torch's ``OutOfMemoryError`` and the CPU allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text or "cannot allocate memory" in text)


def _user_error_message(exc: BaseException, command: str) -> str | None:
    """The one-line message of an exception caused by the user's input, ``None`` for a bug.

    By kind: embgeom's own input checks (a ``ValueError``/``TypeError``/``ArithmeticError``
    raised by a ``raise`` statement in embgeom, e.g. a diverged optimisation that names its
    ``lr``), ``UsageError``, ``OSError`` (files, folders, disks), a missing package, a file
    that is not UTF-8 text, and running out of memory for the sizes asked for.
    """
    if isinstance(exc, (UsageError, OSError, ImportError)):
        return str(exc)
    if _out_of_memory(exc):
        return (f"out of memory ({type(exc).__name__}: {exc}); the sizes asked for need more "
                f"memory than this machine has: lower {_SIZE_FLAGS[command]}")
    if isinstance(exc, UnicodeDecodeError):
        return (f"a file that {_FILE_FLAGS[command]} names is not UTF-8 text ({exc}); rerun with "
                "--debug to see which")
    if isinstance(exc, (ValueError, TypeError, ArithmeticError)) and _raised_on_purpose(exc):
        return str(exc)
    return None


def _one_line(text: str) -> str:
    """Messages of the libraries underneath run over several lines: one line for stderr."""
    return " ".join(str(text).split())


class _LogFormatter(logging.Formatter):
    """``embgeom: <level>: <message>``, the level in lower case, the one format of every line
    the command writes to stderr (the warnings of :func:`_show_warning` too)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"embgeom: {record.levelname.lower()}: {_one_line(record.getMessage())}"
        if record.exc_info:  # logger.exception(...): the traceback below the line, as logging does
            line += "\n" + self.formatException(record.exc_info)
        return line


def _setup_logging(args) -> None:
    level = logging.ERROR if args.quiet else (
        logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_LogFormatter())
        root.addHandler(handler)
    root.setLevel(level)
    if level == logging.WARNING:
        # where the model and the hidden states came from (a cache entry or a fresh
        # computation) is one line each, and tells a user why a run took 4 s or 40 s
        logging.getLogger("embgeom.adapters").setLevel(logging.INFO)
    if level == logging.WARNING and not _progress(args):
        # no progress bars (not a terminal, e.g. under nohup): the report's phases say they
        # started and ended, so a long run shows a sign of life
        logging.getLogger("embgeom.report").setLevel(logging.INFO)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` while :func:`main` runs: ``embgeom: warning: <message>`` on one
    line of stderr (not Python's ``path:line: Category: message`` and the quoted source line,
    which name embgeom's internals), through the ``py.warnings`` logger, so ``-q`` hides it."""
    log = logging.getLogger("py.warnings")
    if not log.isEnabledFor(logging.WARNING):
        return
    stream = sys.stderr if file is None else file
    if stream is None:  # no stderr (pythonw)
        return
    try:
        stream.write(f"embgeom: warning: {_one_line(message)}\n")
    except (OSError, ValueError):  # a closed stream: the warning is lost, the run goes on
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``embgeom`` console script and of ``python -m embgeom``.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code: 0 done, 1 internal error, 2 bad input (argparse's too), 130 interrupted.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(executor_flags=bool({"report", "cram"} & set(argv)))
    args = parser.parse_args(argv)
    if args.quiet and args.verbose:
        parser.error("-q/--quiet and -v/--verbose exclude each other")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # torch's OpenMP threads spin while they wait; passive waits keep a busy machine usable.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not _progress(args):
        # the bars of the libraries underneath (transformers' "Writing model shards", the GGUF
        # loader's): huggingface_hub's switch, which transformers reads on import, and tqdm's
        # own default for bars that do not pass disable= themselves
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")
    _setup_logging(args)
    handlers = {"report": _cmd_report, "cram": _cmd_cram, "copy": _cmd_copy}
    # installed here only, never at import: a program that imports embgeom keeps its own
    old_showwarning = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        result = handlers[args.command](args)
    except KeyboardInterrupt:
        print("embgeom: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - sorted into bad input and bugs just below
        if args.debug:
            raise
        message = _user_error_message(exc, args.command)
        if message is not None:
            message = _in_flag_terms(_one_line(message), parser, args.command)
            print(f"embgeom {args.command}: error: {message}", file=sys.stderr)
            return 2
        print(f"embgeom {args.command}: internal error ({type(exc).__name__}: "
              f"{_one_line(exc)}); this is a bug, not your input: rerun with --debug for the "
              "traceback and report it", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = old_showwarning
    _print_result(args.command, result)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
