"""Named cramming optimisers (presets) for :func:`embgeom.cramming.horizons`, each with its source.

A :class:`CramProtocol` says how the memory vectors of one target are optimised while its target
grows (progressive cramming): the update rule (Adam/AdamW or L-BFGS), the learning-rate schedule,
restarts, the parametrisation of the memory vectors, and the per-length stopping rule. The
presets are the ones compared in ``benchmarks/bench_cram_optimisers.py`` (issue 23); every one
runs under the same per-length step budget and the same total step cap there, so that they are
compared at equal compute.

numpy only (no torch): the presets can be listed and validated without loading a model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from embgeom._validation import check_positive, check_positive_int

__all__ = ["CramProtocol", "PROTOCOLS", "DEFAULT_PROTOCOL", "get_protocol"]

_ALGORITHMS = ("adam", "lbfgs")
_SCHEDULES = ("constant", "cosine")
_PARAMETRISATIONS = ("full", "whitened", "lowrank")


@dataclass(frozen=True)
class CramProtocol:
    """How memory vectors are optimised by :func:`embgeom.cramming.horizons`.

    Attributes
    ----------
    name : str
        The preset's name (a key of :data:`PROTOCOLS`, or a user's own).
    source : str
        Where the recipe comes from (paper, code, or this project's study).
    algorithm : {"adam", "lbfgs"}
        ``"adam"``: Adam, or AdamW when ``weight_decay > 0`` (the formulas of
        ``torch.optim.Adam`` / ``AdamW``), batched over targets with per-target state, so a
        target's trajectory does not depend on the others. ``"lbfgs"``: ``torch.optim.LBFGS``
        with the strong-Wolfe line search, one target at a time.
    lr : float
        Peak learning rate (> 0).
    betas : (float, float)
        Adam's decay rates, each in [0, 1).
    weight_decay : float
        Decoupled weight decay (>= 0; AdamW).
    warmup : int
        Linear warm-up of the learning rate over the first ``warmup`` updates of a target's run
        (0: none). Counted over the whole run, not per length.
    schedule : {"constant", "cosine"}
        Within one length: constant, or cosine decay from ``lr`` to ``lr * lr_floor`` over the
        per-length budget (restarting when the target grows).
    lr_floor : float
        The cosine schedule's final fraction of ``lr``, in (0, 1].
    restart_after : int or None
        After this many updates at one length without a new lowest loss, the memory vectors go
        back to the lowest-loss vectors of that length, the optimiser state is cleared, and the
        learning rate is multiplied by ``restart_lr_factor``. None: never.
    restart_lr_factor : float
        In (0, 1].
    parametrisation : {"full", "whitened", "lowrank"}
        ``"full"``: the memory vectors P themselves. ``"whitened"``: ``P = mu + sd * Z``,
        Z optimised (mu, sd: per-coordinate mean and std of the input embeddings, the
        initialisation's scale), so Adam's per-coordinate step is ``lr * sd``.
        ``"lowrank"``: ``P = P0 + Z U^T`` with U the top ``rank`` principal directions of the
        input-embedding rows (d x rank), Z (m x rank) from zero.
    rank : int
        The rank of ``"lowrank"`` (>= 1; clipped to d).
    patience : int or None
        A length fails once the target's best token accuracy at that length has not risen for
        this many updates (None: only the per-length budget ends it).
    reset_on_grow : bool
        Clear Adam's moments when the target grows (False: keep them; the objective changes by
        one token).
    lbfgs_history : int
        L-BFGS memory (pairs kept).
    """

    name: str
    source: str
    algorithm: str = "adam"
    lr: float = 1e-2
    betas: tuple = (0.9, 0.999)
    weight_decay: float = 0.0
    warmup: int = 0
    schedule: str = "constant"
    lr_floor: float = 0.01
    restart_after: int | None = None
    restart_lr_factor: float = 0.5
    parametrisation: str = "full"
    rank: int = 256
    patience: int | None = None
    reset_on_grow: bool = False
    lbfgs_history: int = 10

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name: expected a non-empty str, got {self.name!r}")
        if self.algorithm not in _ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {_ALGORITHMS}, got {self.algorithm!r}")
        check_positive(self.lr, "lr")
        b = self.betas
        if isinstance(b, (str, bytes)) or not hasattr(b, "__len__") or len(b) != 2:
            raise TypeError(f"betas: expected a pair of numbers in [0, 1), got {b!r}")
        for i, v in enumerate(b):
            if not 0 <= check_positive(v, f"betas[{i}]", allow_zero=True) < 1:
                raise ValueError(f"betas[{i}]: expected a number in [0, 1), got {v}")
        object.__setattr__(self, "betas", (float(b[0]), float(b[1])))
        check_positive(self.weight_decay, "weight_decay", allow_zero=True)
        check_positive_int(self.warmup, "warmup", minimum=0)
        if self.schedule not in _SCHEDULES:
            raise ValueError(f"schedule: expected one of {_SCHEDULES}, got {self.schedule!r}")
        if not 0 < check_positive(self.lr_floor, "lr_floor") <= 1:
            raise ValueError(f"lr_floor: expected a number in (0, 1], got {self.lr_floor}")
        if self.restart_after is not None:
            check_positive_int(self.restart_after, "restart_after")
        if not 0 < check_positive(self.restart_lr_factor, "restart_lr_factor") <= 1:
            raise ValueError(f"restart_lr_factor: expected a number in (0, 1], got "
                             f"{self.restart_lr_factor}")
        if self.parametrisation not in _PARAMETRISATIONS:
            raise ValueError(f"parametrisation: expected one of {_PARAMETRISATIONS}, got "
                             f"{self.parametrisation!r}")
        check_positive_int(self.rank, "rank")
        if self.patience is not None:
            check_positive_int(self.patience, "patience")
        if not isinstance(self.reset_on_grow, bool):
            raise TypeError(f"reset_on_grow: expected True or False, got {self.reset_on_grow!r}")
        check_positive_int(self.lbfgs_history, "lbfgs_history")
        if self.algorithm == "lbfgs" and self.parametrisation != "full":
            raise ValueError("parametrisation: L-BFGS runs on the full memory vectors only")

    def replace(self, **changes) -> "CramProtocol":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-able fields (the settings a horizon record is keyed on)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


_KURATOV = ("Y. Kuratov et al., 'Cramming 1568 Tokens into a Single Vector and Back Again', "
            "ACL 2025 (arXiv 2502.13063), released train.py: AdamW lr 1e-2, betas (0.9, 0.9), "
            "weight decay 0.01, up to 5,000 steps, patience 2,000")

#: The named presets. Budgets (steps per length, total cap) are arguments of
#: :func:`embgeom.cramming.horizons`, not part of a preset, so presets are compared at equal
#: budget; a preset's own patience still applies within it.
PROTOCOLS = {
    "adam": CramProtocol(
        "adam", "embgeom's per-length default before issue 23: Adam lr 1e-2, betas "
        "(0.9, 0.999), constant lr, no weight decay, no patience"),
    "paper": CramProtocol(
        "paper", "M. Meyer et al., ICML 2026, code transformers_accessibility/cramming: AdamW "
        "lr 1e-2, betas (0.9, 0.9), weight decay 0.01, up to 3,000 steps, patience 500",
        betas=(0.9, 0.9), weight_decay=0.01, patience=500),
    "kuratov": CramProtocol("kuratov", _KURATOV, betas=(0.9, 0.9), weight_decay=0.01,
                            patience=2000),
    "progressive": CramProtocol(
        "progressive", "Tarasov et al., ICML 2026 (FusionBrainLab/progressive_cramming): AdamW "
        "lr 0.1 with 100 warm-up steps, the target grown from the previous solution; betas and "
        "weight decay are torch.optim.AdamW's defaults (0.9, 0.999), 0.01 (assumed)",
        lr=0.1, warmup=100, weight_decay=0.01),
    "cosine": CramProtocol(
        "cosine", "this project's study: Adam lr 3e-2 decayed by a cosine to 3e-4 within each "
        "length's budget", lr=3e-2, schedule="cosine", lr_floor=0.01),
    "restarts": CramProtocol(
        "restarts", "this project's study: Adam lr 3e-2; after 100 updates without a new lowest "
        "loss, back to the lowest-loss vector with cleared moments and half the lr",
        lr=3e-2, restart_after=100, restart_lr_factor=0.5),
    "whitened": CramProtocol(
        "whitened", "this project's study: Adam lr 0.1 on Z with P = mu + sd * Z (the "
        "embedding's per-coordinate scale)", lr=0.1, parametrisation="whitened"),
    "lowrank": CramProtocol(
        "lowrank", "Tarasov et al., ICML 2026 (a rank-256 subspace lengthened the horizon "
        "2.9x on SmolLM2-1.7B): Adam lr 1e-2 on Z with P = P0 + Z U^T, U the top-256 principal "
        "directions of the input embeddings", lr=1e-2, parametrisation="lowrank", rank=256),
    "lbfgs": CramProtocol(
        "lbfgs", "torch.optim.LBFGS (strong-Wolfe line search, history 10, lr 1), one target "
        "at a time", algorithm="lbfgs", lr=1.0),
}

#: The default of :func:`embgeom.cramming.horizons`; chosen by the optimiser study
#: (``benchmarks/bench_cram_optimisers.py``, ``docs/cramming.md``).
DEFAULT_PROTOCOL = "progressive"


def get_protocol(protocol) -> CramProtocol:
    """A :class:`CramProtocol` from a preset name or a protocol.

    Raises
    ------
    ValueError
        An unknown name (the message lists the presets).
    TypeError
        Neither a str nor a :class:`CramProtocol`.
    """
    if isinstance(protocol, CramProtocol):
        return protocol
    if isinstance(protocol, str):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol: expected one of {sorted(PROTOCOLS)} or a CramProtocol, "
                             f"got {protocol!r}")
        return PROTOCOLS[protocol]
    raise TypeError(f"protocol: expected a preset name or a CramProtocol, got "
                    f"{type(protocol).__name__}")
