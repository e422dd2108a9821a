"""The copy model: a randomly initialised Llama-style decoder (RoPE), its training, its checkpoint."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from embgeom._progress import tqdm_kwargs
from embgeom._validation import check_positive, check_positive_int, check_seed

from ._task import TASK_FILE, CopyTask, _check_task_fits, _check_threads, _torch_threads


def make_copy_model(
    task: CopyTask,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_length: int | None = None,
    seed: int = 0,
):
    """A randomly initialised Llama-style decoder (RoPE) sized for the copy task.

    Parameters
    ----------
    task : CopyTask
    hidden_size : int, default 64
        Hidden size ``d`` (a multiple of ``num_heads``). The MLP width is ``4 d``.
    num_layers : int, default 2
        Decoder blocks. Copying needs at least two (an induction-style circuit).
    num_heads : int, default 4
    max_length : int, optional
        Recorded as ``max_position_embeddings`` (RoPE has no position table; this only informs
        transformers). Default ``8 * l_train + 2``.
    seed : int, default 0
        Seed of the initialisation (``torch.manual_seed``).

    Returns
    -------
    transformers.LlamaForCausalLM
        float32, on CPU, in train mode, untied unembedding (``lm_head``), no bias.

    Raises
    ------
    TypeError, ValueError
        Non-positive sizes, or ``hidden_size`` not divisible by ``num_heads``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    d = check_positive_int(hidden_size, "hidden_size")
    layers = check_positive_int(num_layers, "num_layers")
    heads = check_positive_int(num_heads, "num_heads")
    if d % heads:
        raise ValueError(f"hidden_size: must be divisible by num_heads={heads}, got {d}")
    if max_length is None:
        max_length = 8 * task.l_train + 2
    max_length = check_positive_int(max_length, "max_length", minimum=2)
    config = LlamaConfig(
        vocab_size=task.vocab_size,
        hidden_size=d,
        intermediate_size=4 * d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_length,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=False,
        pad_token_id=task.pad_id,
        bos_token_id=None,
        eos_token_id=None,
        use_cache=True,
    )
    config._attn_implementation = "sdpa"
    seed_init = check_positive_int(seed, "seed", minimum=0)
    torch.manual_seed(seed_init)
    model = LlamaForCausalLM(config)
    return model.float().train()


@dataclass
class TrainingHistory:
    """Loss curve of :func:`train_copy_model` (JSON-able through :meth:`to_dict`)."""

    steps: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {"steps": list(self.steps), "loss": list(self.loss), "wall_s": float(self.wall_s)}


def train_copy_model(
    model,
    task: CopyTask,
    *,
    steps: int = 800,
    batch_size: int = 64,
    lr: float = 3e-3,
    warmup: float = 0.1,
    seed: int = 0,
    num_threads: int | None = 1,
    progress: bool = True,
    log_every: int = 50,
):
    """Train ``model`` on the copy task in place (AdamW, one-cycle schedule, gradient clipping 1).

    Each step draws ``batch_size`` examples with lengths uniform on ``1 .. task.l_train`` and
    symbols uniform on the alphabet; the loss is the mean cross-entropy (nats per token) over the
    copied positions only.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose vocabulary covers ``task.vocab_size`` (see :func:`make_copy_model`).
    task : CopyTask
    steps : int, default 800
    batch_size : int, default 64
    lr : float, default 3e-3
        Peak learning rate of the one-cycle (linear warm-up, cosine decay) schedule.
    warmup : float, default 0.1
        Fraction of steps spent warming up, in (0, 1).
    seed : seed, default 0
        Seed of the training data stream: anything ``numpy.random.default_rng`` accepts
        (:func:`embgeom._validation.check_seed`).
    num_threads : int or None, default 1
        torch threads during training (restored afterwards); ``None`` leaves torch's setting.
    progress : bool, default True
        Show a tqdm bar.
    log_every : int, default 50
        Record the loss every this many steps.

    Returns
    -------
    TrainingHistory
        The recorded losses (nats per copied token) and the wall time in seconds.

    Raises
    ------
    TypeError, ValueError
        Bad step counts, batch size, learning rate or warm-up fraction.
    """
    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    steps = check_positive_int(steps, "steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    lr = check_positive(lr, "lr")
    warmup = check_positive(warmup, "warmup")
    if warmup >= 1:
        raise ValueError(f"warmup: expected a fraction in (0, 1), got {warmup}")
    log_every = check_positive_int(log_every, "log_every")
    _check_threads(num_threads)
    _check_task_fits(model, task)
    rng = check_seed(seed)
    history = TrainingHistory()
    t0 = time.perf_counter()
    with _torch_threads(num_threads):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=lr, total_steps=steps, pct_start=warmup, anneal_strategy="cos"
        )
        bar = tqdm(range(steps), desc=f"copy train (L<={task.l_train})", **tqdm_kwargs(progress))
        for step in bar:
            lengths = rng.integers(1, task.l_train + 1, size=batch_size)
            ids, labels = task.training_batch(lengths, rng)
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % log_every == 0 or step == steps - 1:
                value = float(loss.detach())
                history.steps.append(step)
                history.loss.append(value)
                bar.set_postfix(loss=f"{value:.4f}")
        model.eval()
    history.wall_s = time.perf_counter() - t0
    return history


def load_copy_model(path):
    """Load a checkpoint written by :func:`run_copy`: ``(model, task)`` (model in eval mode)."""
    from transformers import LlamaForCausalLM

    path = Path(path)
    meta = json.loads((path / TASK_FILE).read_text())
    task = CopyTask(alphabet=int(meta["alphabet"]), l_train=int(meta["l_train"]))
    model = LlamaForCausalLM.from_pretrained(path).float().eval()
    return model, task
