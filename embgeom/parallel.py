"""Local and Ray executors for the loops over tokens, samples and targets.

The work of this library grows with the vocabulary and the sweep, not with one call: the
unargmaxable scan is one witness search or LP per token, the cell volumes one assignment per
sample, a cramming sweep one optimisation per (m, length, target). Those loops are written as a
*keyed map*: a dict ``{key: args}`` of independent tasks, one module-level function ``fn``, and
:meth:`Executor.map_keyed` runs ``fn(*args, **shared, **kwargs[, seed=...])`` for every key and
returns ``{key: result}`` in the order of the task dict, never in the order the tasks finished.

Two back ends share that contract:

- :class:`LocalExecutor` (the default): a plain loop in this process. Needs nothing new.
- :class:`RayExecutor`: one Ray task per key on a Ray cluster (``pip install embgeom[ray]``).
  Ray is imported only when this executor starts, so ``import embgeom`` stays Ray-free.
  ``address`` goes to ``ray.init(address=...)``; without it Ray's own convention applies (the
  ``RAY_ADDRESS`` environment variable, else a new local cluster). Large read-only objects in
  ``shared`` (the unembedding ``W``: 49,152 x 576 float32 = 113 MB for SmolLM2, 671 MB for
  Gemma-3-270m) go to the object store once (``ray.put``) and every task receives a reference:
  numpy arrays are then read zero-copy from shared memory on each node, not re-sent per task. A
  task whose worker process dies is re-run by Ray up to ``max_retries`` times.

Same seed, same result: with ``seed=`` every task receives its own
:class:`numpy.random.SeedSequence`, derived from the root seed and the task's *key* alone
(:func:`task_seed`), not from the order or the process in which tasks run. So a local run, a Ray
run with one worker and a Ray run with many give bit-identical results; and a sweep that skips
the keys it has already done (resume) draws the same numbers for the rest. For an integer key
``i`` the derived sequence is exactly ``root.spawn(n)[i]`` of a fresh root, so chunk ``i`` of a
keyed map draws what chunk ``i`` of today's serial loops (``SeedSequence.spawn`` per chunk)
draws.

References
----------
P. Moritz et al., "Ray: A Distributed Framework for Emerging AI Applications", OSDI 2018.
NumPy, "Parallel random number generation" (``SeedSequence.spawn``, spawn keys),
https://numpy.org/doc/stable/reference/random/parallel.html.
"""

from __future__ import annotations

import abc
import hashlib
import numbers
import time
from collections.abc import Mapping
from contextlib import contextmanager

import numpy as np

from ._progress import check_progress, tqdm_kwargs
from ._validation import check_positive, check_positive_int

__all__ = [
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "get_executor",
    "effective_n_jobs",
    "map_keyed",
    "executor_scope",
    "task_seed",
    "add_executor_arguments",
    "executor_from_args",
]

_EXECUTOR_NAMES = ("local", "ray")


# --------------------------------------------------------------------------------------------
# seeds keyed by task
# --------------------------------------------------------------------------------------------
def _as_root_seed(seed) -> np.random.SeedSequence:
    """A root ``SeedSequence`` from an int >= 0 or a SeedSequence (None is refused: no run
    could be repeated)."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, (numbers.Integral, np.integer)) and not isinstance(seed, bool):
        if int(seed) < 0:
            raise ValueError(f"seed: expected integers >= 0, got {seed!r}")
        return np.random.SeedSequence(int(seed))
    raise TypeError(f"seed: expected a non-negative int or a numpy SeedSequence, got {type(seed).__name__}")


def _canonical_key(key):
    """The key with numpy scalars turned into Python ones; TypeError for anything whose ``repr``
    is not stable across processes (objects with addresses, sets, dicts, arrays)."""
    if isinstance(key, (np.integer, np.floating, np.bool_)):
        return key.item()
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    if isinstance(key, tuple):
        return tuple(_canonical_key(k) for k in key)
    raise TypeError(
        f"task key: expected an int, a str, a float, None or a tuple of those, got {type(key).__name__}"
    )


def _key_words(key) -> tuple:
    """Spawn-key words of a task key: the key itself for an int in [0, 2**32) or a tuple of
    such ints (so integer keys reproduce ``SeedSequence.spawn``), else four 32-bit words of a
    BLAKE2b digest of the key's canonical ``repr`` (collision probability about 2**-128)."""
    key = _canonical_key(key)

    def small(k):
        return isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**32

    if small(key):
        return (key,)
    if isinstance(key, tuple) and key and all(small(k) for k in key):
        return key
    digest = hashlib.blake2b(repr(key).encode(), digest_size=16).digest()
    return tuple(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4))


def task_seed(seed, key) -> np.random.SeedSequence:
    """The ``SeedSequence`` of one task: a function of the root seed and the task key only.

    Parameters
    ----------
    seed : int >= 0 or numpy.random.SeedSequence
        Root seed.
    key : int, str, float, None, or tuple of those
        The task key. An int ``i`` in ``[0, 2**32)`` (or a tuple of such ints) is appended to the
        root's ``spawn_key`` as is, so ``task_seed(root, i)`` equals ``root.spawn(n)[i]`` of a
        root that has spawned no child yet; other keys append four words of a BLAKE2b digest of
        their ``repr``.

    Returns
    -------
    numpy.random.SeedSequence
        Same ``entropy`` and ``pool_size`` as the root, ``spawn_key = root.spawn_key + words``.
        Independent of the root's ``n_children_spawned``, of the other keys, and of the order
        or process in which tasks run.

    Raises
    ------
    TypeError
        ``seed`` not an int or a SeedSequence; ``key`` of another type.
    ValueError
        Negative ``seed``.

    Examples
    --------
    >>> import numpy as np
    >>> a = task_seed(7, 3).generate_state(2)
    >>> b = np.random.SeedSequence(7).spawn(4)[3].generate_state(2)
    >>> bool((a == b).all())
    True
    """
    root = _as_root_seed(seed)
    return np.random.SeedSequence(
        root.entropy, spawn_key=tuple(root.spawn_key) + _key_words(key), pool_size=root.pool_size
    )


# --------------------------------------------------------------------------------------------
# the task call, identical in both back ends
# --------------------------------------------------------------------------------------------
def _run_task(fn, args, seed, kwargs, names, *shared_values):
    """Run one task: ``fn(*args, **dict(zip(names, shared_values)), **kwargs[, seed=seed])``.

    Module-level so that Ray ships it by reference; ``shared_values`` are top-level arguments so
    that Ray resolves their object references (zero-copy for numpy arrays) before the call.
    """
    call_kw = dict(zip(names, shared_values))
    call_kw.update(kwargs)
    if seed is not None:
        call_kw["seed"] = seed
    return fn(*args, **call_kw)


def _check_map_arguments(fn, tasks, shared, kwargs, seed):
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if not isinstance(tasks, Mapping):
        raise TypeError(f"tasks: expected a dict {{key: tuple of positional arguments}}, got {type(tasks).__name__}")
    for key, args in tasks.items():
        _canonical_key(key)
        if not isinstance(args, tuple):
            raise TypeError(
                f"tasks[{key!r}]: expected a tuple of positional arguments, got {type(args).__name__} "
                "(wrap a single argument as (arg,))"
            )
    shared = {} if shared is None else dict(shared)
    kwargs = {} if kwargs is None else dict(kwargs)
    for name in list(shared) + list(kwargs):
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"shared, kwargs: names must be identifiers, got {name!r}")
    clash = set(shared) & set(kwargs)
    if seed is not None:
        clash |= {"seed"} & (set(shared) | set(kwargs))
    if clash:
        raise ValueError(f"shared, kwargs: the name(s) {sorted(clash)} are given twice (or clash with seed)")
    root = None if seed is None else _as_root_seed(seed)
    seeds = {key: (None if root is None else task_seed(root, key)) for key in tasks}
    return shared, kwargs, seeds


class _InOrder:
    """Release results to ``on_result`` in task order, as soon as every earlier task is done."""

    def __init__(self, keys, on_result):
        self.keys = list(keys)
        self.on_result = on_result
        self.results: dict = {}
        self.next = 0

    def add(self, key, value):
        self.results[key] = value
        while self.next < len(self.keys) and self.keys[self.next] in self.results:
            k = self.keys[self.next]
            if self.on_result is not None:
                self.on_result(k, self.results[k])
            self.next += 1

    def ordered(self) -> dict:
        return {k: self.results[k] for k in self.keys}


# --------------------------------------------------------------------------------------------
# executors
# --------------------------------------------------------------------------------------------
class Executor(abc.ABC):
    """Runs a keyed map of independent tasks (base class of :class:`LocalExecutor` and
    :class:`RayExecutor`).

    Subclasses implement :meth:`map_keyed`; :meth:`put` and :meth:`close` default to no-ops.
    An executor is a context manager (``with get_executor("ray") as ex: ...``).
    """

    name = "base"

    def put(self, obj):
        """Make ``obj`` available to tasks; pass the returned handle in ``shared``.

        Local: ``obj`` itself. Ray: an ``ObjectRef`` (``ray.put``), so several maps over the same
        ``W`` store it once.
        """
        return obj

    def close(self) -> None:
        """Release what this executor started (nothing for the local one)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @abc.abstractmethod
    def map_keyed(self, fn, tasks, *, shared=None, kwargs=None, seed=None, on_result=None,
                  progress: bool = True, desc: str | None = None, num_cpus=None, num_gpus=None) -> dict:
        """Run ``fn`` once per task and return the results keyed by task.

        Parameters
        ----------
        fn : callable
            A module-level function (Ray ships it by reference: it must be importable on every
            worker). Called as ``fn(*args, **shared, **kwargs)`` plus ``seed=<SeedSequence>``
            when ``seed`` is given. It must not depend on global state that differs between
            processes.
        tasks : dict {key: tuple}
            One entry per task: the key (int, str, float, None or a tuple of those; it names the
            task's result and derives its seed) and the task's positional arguments as a tuple.
            The caller skips keys it has already done (resume).
        shared : dict {name: object}, optional
            Read-only objects every task needs (arrays, a :class:`~embgeom.cells.Decoder`),
            passed by keyword. Ray: stored once in the object store; numpy arrays arrive
            read-only. A handle from :meth:`put` is accepted as a value.
        kwargs : dict, optional
            Small keyword arguments passed to every task as they are.
        seed : int >= 0 or numpy.random.SeedSequence, optional
            Root seed: task ``key`` receives ``seed=task_seed(seed, key)``.
        on_result : callable ``(key, result) -> None``, optional
            Called in *task order* as soon as a task and all tasks before it are done (e.g. to
            append a JSON line: the file is then the same whatever the completion order, and a
            crash leaves a prefix that a rerun skips).
        progress : bool, default True
            tqdm bar over completed tasks.
        desc : str, optional
            Label of the bar.
        num_cpus, num_gpus : float, optional
            Ray: per-task resources for this map (default the executor's). Local: ignored.

        Returns
        -------
        dict
            ``{key: fn(...)}`` in the order of ``tasks``.

        Raises
        ------
        TypeError, ValueError
            Bad arguments (``tasks`` not a dict of tuples, keys of an unsupported type, names
            given twice, bad seed). An exception raised by a task propagates (Ray: as a
            ``RayTaskError`` that is also an instance of the task's exception class).
        """


def effective_n_jobs(n_jobs=None) -> int:
    """The number of worker processes ``n_jobs`` asks for, scikit-learn's convention.

    Parameters
    ----------
    n_jobs : int or None
        ``None`` or 1: one (the tasks run in this process). ``k > 1``: ``k`` processes.
        Negative: ``n_cpus + 1 + n_jobs`` (``-1`` every CPU this process may use, ``-2`` all
        but one), at least 1.

    Returns
    -------
    int
        >= 1.

    Raises
    ------
    TypeError
        ``n_jobs`` not an int (a bool is refused).
    ValueError
        ``n_jobs == 0``.

    Examples
    --------
    >>> effective_n_jobs(None), effective_n_jobs(3)
    (1, 3)
    """
    if n_jobs is None:
        return 1
    if not isinstance(n_jobs, (numbers.Integral, np.integer)) or isinstance(n_jobs, bool):
        raise TypeError(f"n_jobs: expected an int or None, got {type(n_jobs).__name__}")
    n_jobs = int(n_jobs)
    if n_jobs == 0:
        raise ValueError("n_jobs: expected a non-zero int (-1 for every CPU), got 0")
    if n_jobs > 0:
        return n_jobs
    return max(1, _n_cpus() + 1 + n_jobs)


def _n_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


#: The task function, shared values and their names of the map a pool worker serves; set once
#: per worker by :func:`_init_worker`, so a large ``W`` crosses to each worker once, not per task.
_WORKER: dict = {}


def worker_state() -> dict | None:
    """The dict that a :class:`LocalExecutor` pool worker keeps between its tasks (buffers a
    task may reuse), or ``None`` outside a pool worker (a serial run keeps nothing)."""
    return _WORKER.setdefault("state", {}) if "fn" in _WORKER else None


def _init_worker(fn, names, values, threads: int) -> None:
    """Initialiser of a :class:`LocalExecutor` pool worker: keep the map's function and shared
    values, and limit the worker's BLAS/OpenMP threads (so ``n_jobs`` workers do not fight over
    the cores: ``threads = n_cpus // n_workers``)."""
    import os

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        # this runs in a pool worker that the executor started (never in the caller's
        # process, whose environment stays as it was); libraries loaded later (torch) read these
        os.environ[var] = str(threads)
    try:
        from threadpoolctl import threadpool_limits

        _WORKER["limits"] = threadpool_limits(limits=threads)  # libraries loaded already
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        pass
    if isinstance(values, _Mapped):
        values = values.load()
    _WORKER.update(fn=fn, names=names, values=values)


#: Arrays of at least this many bytes among a pool's shared values reach its workers as
#: read-only memory maps of one file each (joblib's ``max_nbytes`` default, 1 MB), not pickled
#: into every worker: SmolLM2's 113 MB ``W`` took about 1 s to cross to two workers, 0.04 s
#: this way.
MMAP_MIN_BYTES = 1 << 20


def _open_array(path: str) -> np.ndarray:
    """A read-only array on the ``.npy`` file ``path``, memory-mapped (a plain ndarray view)."""
    return np.asarray(np.load(path, mmap_mode="r"))


class _Mapped:
    """Shared values pickled with their large arrays (:data:`MMAP_MIN_BYTES`) written to ``.npy``
    files in ``folder`` (in ``/dev/shm`` where it exists) and reduced to :func:`_open_array`:
    every worker maps the same pages. The files are read-only to the workers and removed by
    :meth:`close` when the pool is done."""

    def __init__(self, values):
        import io
        import os
        import pickle
        import tempfile

        shm = "/dev/shm"
        self.folder = tempfile.mkdtemp(prefix="embgeom-pool-",
                                       dir=shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None)
        self.n_mapped = 0
        folder, mapped = self.folder, self

        class _Pickler(pickle.Pickler):
            def reducer_override(self, obj):
                if (type(obj) is np.ndarray and obj.nbytes >= MMAP_MIN_BYTES
                        and obj.dtype.hasobject is False):
                    path = os.path.join(folder, f"a{mapped.n_mapped}.npy")
                    np.save(path, obj, allow_pickle=False)
                    mapped.n_mapped += 1
                    return _open_array, (path,)
                return NotImplemented

        buf = io.BytesIO()
        try:
            _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(values)
        except BaseException:
            self.close()
            raise
        self.blob = buf.getvalue()

    def load(self):
        import pickle

        return pickle.loads(self.blob)

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def _pool_context(fn):
    """The multiprocessing context of the pools: ``forkserver`` where the OS has it (its server
    imports numpy, scipy and this package once, so each worker starts as a fork of a clean
    process with them loaded), else ``spawn``."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():  # pragma: no cover - Windows, macOS
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # read when the server starts (the first pool of this process); later calls change nothing
    ctx.set_forkserver_preload(["numpy", "scipy.linalg", "embgeom.volumes", "embgeom.cells",
                                str(getattr(fn, "__module__", "embgeom"))])
    return ctx


def _worker_task(args, seed, kwargs):
    """One task in a pool worker, with the function and shared values of :func:`_init_worker`."""
    return _run_task(_WORKER["fn"], args, seed, kwargs, _WORKER["names"], *_WORKER["values"])


class LocalExecutor(Executor):
    """Run the tasks on this machine: one after the other, or on a pool of ``n_jobs`` processes.

    With ``n_jobs`` > 1 (``-1``: every CPU) a map of two or more tasks runs on a
    ``concurrent.futures.ProcessPoolExecutor`` of ``min(n_jobs, n_tasks)`` worker processes
    (started by ``forkserver`` where the OS has it, else ``spawn``: never a fork of a process
    that holds torch's or BLAS's threads). The function and the ``shared`` values are sent to
    each worker once, when it starts; each task then sends only its arguments and seed. Every
    task's seed comes from its key (:func:`task_seed`) and the results are returned in task
    order, so a pool gives the same results as the serial run, bit for bit, whatever the
    number of workers (pinned in ``tests/test_parallel.py``). Each worker's BLAS and OpenMP
    use ``n_cpus // n_workers`` threads. The pool lives for one :meth:`map_keyed` (starting it
    costs about a second per worker, the imports of the task's module); a map of one task runs
    in this process.

    Parameters
    ----------
    n_jobs : int or None, default None
        Worker processes (:func:`effective_n_jobs`: ``None`` or 1 serial, ``-1`` every CPU).

    Raises
    ------
    TypeError, ValueError
        Bad ``n_jobs`` (not an int, or 0).

    Examples
    --------
    >>> def add(a, b, *, offset):
    ...     return a + b + offset
    >>> LocalExecutor().map_keyed(add, {"x": (1, 2), "y": (3, 4)}, kwargs={"offset": 10}, progress=False)
    {'x': 13, 'y': 17}
    """

    name = "local"

    def __init__(self, n_jobs: int | None = None):
        self.n_jobs = n_jobs
        self.n_workers = effective_n_jobs(n_jobs)

    def __repr__(self) -> str:
        return "LocalExecutor()" if self.n_jobs is None else f"LocalExecutor(n_jobs={self.n_jobs})"

    def prepare(self, fn) -> None:
        """Start the pool's process server now for a later map of ``fn``, so that its imports
        (numpy, scipy, this package: about 2 s) overlap the caller's work before the map;
        nothing for a serial executor or without ``forkserver``. Changes no result."""
        if self.n_workers <= 1:
            return
        ctx = _pool_context(fn)
        if ctx.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()

    def map_keyed(self, fn, tasks, *, shared=None, kwargs=None, seed=None, on_result=None,
                  progress: bool = True, desc: str | None = None, num_cpus=None, num_gpus=None) -> dict:
        from tqdm.auto import tqdm

        shared, kwargs, seeds = _check_map_arguments(fn, tasks, shared, kwargs, seed)
        progress = check_progress(progress)
        names, values = tuple(shared), tuple(shared.values())
        sink = _InOrder(tasks, on_result)
        workers = min(self.n_workers, len(tasks))
        with tqdm(total=len(tasks), desc=desc or getattr(fn, "__name__", "tasks"), unit="task",
                  **tqdm_kwargs(progress)) as bar:
            if workers <= 1:
                for key, args in tasks.items():
                    sink.add(key, _run_task(fn, args, seeds[key], kwargs, names, *values))
                    bar.update(1)
            else:
                self._map_pool(fn, tasks, names, values, kwargs, seeds, sink, bar, workers)
        return sink.ordered()

    map_keyed.__doc__ = Executor.map_keyed.__doc__

    @staticmethod
    def _map_pool(fn, tasks, names, values, kwargs, seeds, sink, bar, workers: int) -> None:
        """The tasks on a process pool of ``workers``; results to ``sink`` in task order."""
        import multiprocessing as mp
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ctx = _pool_context(fn)
        threads = max(1, _n_cpus() // workers)
        mapped = _Mapped(values)  # large arrays as memory maps, not one pickle per worker
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(fn, names, mapped, threads))
        try:
            pending = {pool.submit(_worker_task, args, seeds[key], kwargs): key
                       for key, args in tasks.items()}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    key = pending.pop(fut)
                    sink.add(key, fut.result())  # a task's exception propagates here
                    bar.update(1)
        finally:  # an error or an interrupt: drop the tasks not started, stop the workers
            pool.shutdown(wait=True, cancel_futures=True)
            mapped.close()


class RayExecutor(Executor):
    """Run each task as a Ray task on a Ray cluster (local or remote).

    Ray is imported and ``ray.init`` called at the first :meth:`start` or :meth:`map_keyed`,
    not at construction. If Ray is already initialised in this process (by the caller), that
    connection is used as it is and :meth:`close` leaves it open.

    Parameters
    ----------
    address : str, optional
        Passed to ``ray.init(address=...)``: ``"ray://host:10001"`` (Ray client),
        ``"host:6379"`` or ``"auto"`` (a cluster started with ``ray start --head``). ``None``
        (default): Ray's own convention, the ``RAY_ADDRESS`` environment variable if set, else a
        new local cluster on this machine.
    num_cpus : float, default 1
        CPUs each task requests (Ray then sets ``OMP_NUM_THREADS`` in the worker to it). On a
        cluster with ``C`` CPUs at most ``C // num_cpus`` tasks run at once.
    num_gpus : float, default 0
        GPUs each task requests (1 for a cramming batch on ``device="cuda"``; a fraction such
        as 0.25 packs several tasks on one GPU). Ray sets ``CUDA_VISIBLE_DEVICES`` per task.
    max_retries : int, default 3
        Times Ray re-runs a task whose worker process died (killed, out of memory, node lost).
        An exception raised by the task itself is not retried: it propagates.
    runtime_env : dict, optional
        Ray runtime environment of the job (e.g. ``{"py_modules": [embgeom]}`` or
        ``{"working_dir": "."}`` to ship this package to a cluster that lacks it).
    init_kwargs : dict, optional
        Further keyword arguments to ``ray.init`` (e.g. ``num_cpus=2`` for a new local
        cluster; Ray refuses them when connecting to an existing one).
    stall_timeout : float, optional
        Seconds without any task finishing after which :meth:`map_keyed` cancels the rest and
        raises ``TimeoutError`` (a cluster that lost its workers waits forever otherwise).
        Default: wait forever (a cramming task may take hours).

    Attributes
    ----------
    startup_seconds_ : float
        Wall time of ``import ray`` + ``ray.init`` (0 if Ray was already running); set by
        :meth:`start`.

    Raises
    ------
    TypeError, ValueError
        Bad resource numbers or ``address`` not a str.
    TimeoutError
        In :meth:`map_keyed`, after ``stall_timeout`` seconds without progress.
    ImportError
        At :meth:`start`, when Ray is not installed (``pip install "embgeom[ray]"``).
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float = 0,
                 max_retries: int = 3, runtime_env: dict | None = None, init_kwargs: dict | None = None,
                 stall_timeout: float | None = None):
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address: expected a str or None, got {type(address).__name__}")
        self.address = address
        self.num_cpus = check_positive(num_cpus, "num_cpus")
        self.num_gpus = check_positive(num_gpus, "num_gpus", allow_zero=True)
        self.max_retries = check_positive_int(max_retries, "max_retries", minimum=0)
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise TypeError(f"runtime_env: expected a dict or None, got {type(runtime_env).__name__}")
        self.runtime_env = runtime_env
        if init_kwargs is not None and not isinstance(init_kwargs, dict):
            raise TypeError(f"init_kwargs: expected a dict or None, got {type(init_kwargs).__name__}")
        self.init_kwargs = dict(init_kwargs or {})
        self.stall_timeout = None if stall_timeout is None else check_positive(stall_timeout, "stall_timeout")
        self._ray = None
        self._owns_ray = False
        self._remote = None
        self.startup_seconds_ = None

    def __repr__(self) -> str:
        return (f"RayExecutor(address={self.address!r}, num_cpus={self.num_cpus:g}, "
                f"num_gpus={self.num_gpus:g}, max_retries={self.max_retries})")

    def start(self) -> "RayExecutor":
        """Import Ray and connect (or start a local cluster); idempotent.

        Returns
        -------
        RayExecutor
            ``self``, with ``startup_seconds_`` set.

        Raises
        ------
        ImportError
            Ray is not installed.
        """
        if self._ray is not None:
            return self
        t0 = time.perf_counter()
        try:
            import ray
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                'executor="ray" needs Ray: pip install "embgeom[ray]" (or pip install "ray>=2.9")'
            ) from err
        if not ray.is_initialized():
            kw = dict(self.init_kwargs)
            if self.runtime_env is not None:
                kw["runtime_env"] = self.runtime_env
            ray.init(address=self.address, **kw)
            self._owns_ray = True
        self._ray = ray
        self._remote = ray.remote(_run_task)
        self.startup_seconds_ = time.perf_counter() - t0
        return self

    def close(self) -> None:
        """Shut Ray down if this executor started it; keep a connection the caller made."""
        if self._ray is not None and self._owns_ray:
            self._ray.shutdown()
        self._ray = None
        self._remote = None
        self._owns_ray = False

    def put(self, obj):
        """``ray.put(obj)`` (once; pass the returned ``ObjectRef`` in ``shared``)."""
        self.start()
        if isinstance(obj, self._ray.ObjectRef):
            return obj
        return self._ray.put(obj)

    def map_keyed(self, fn, tasks, *, shared=None, kwargs=None, seed=None, on_result=None,
                  progress: bool = True, desc: str | None = None, num_cpus=None, num_gpus=None) -> dict:
        from tqdm.auto import tqdm

        shared, kwargs, seeds = _check_map_arguments(fn, tasks, shared, kwargs, seed)
        progress = check_progress(progress)
        cpus = self.num_cpus if num_cpus is None else check_positive(num_cpus, "num_cpus")
        gpus = self.num_gpus if num_gpus is None else check_positive(num_gpus, "num_gpus", allow_zero=True)
        if not tasks:
            return {}
        self.start()
        ray = self._ray
        names = tuple(shared)
        refs = tuple(self.put(v) for v in shared.values())  # once per map, not per task
        fn_ref = ray.put(fn)
        remote = self._remote.options(num_cpus=cpus, num_gpus=gpus, max_retries=self.max_retries,
                                      retry_exceptions=False)
        pending = {
            remote.remote(fn_ref, args, seeds[key], kwargs, names, *refs): key for key, args in tasks.items()
        }
        sink = _InOrder(tasks, on_result)
        try:
            with tqdm(total=len(tasks), desc=desc or getattr(fn, "__name__", "tasks"), unit="task",
                      **tqdm_kwargs(progress)) as bar:
                last = time.monotonic()
                while pending:
                    # everything that finished within 0.2 s: O(pending) per round, not per task
                    done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.2)
                    if done:
                        last = time.monotonic()
                    elif self.stall_timeout is not None and time.monotonic() - last > self.stall_timeout:
                        raise TimeoutError(
                            f"stall_timeout: no task finished in {self.stall_timeout:g} s "
                            f"({len(pending)} of {len(tasks)} pending; see `ray status`)"
                        )
                    for ref in done:
                        key = pending.pop(ref)
                        sink.add(key, ray.get(ref))
                        bar.update(1)
        finally:
            for ref in pending:  # an error or an interrupt: do not leave tasks running
                ray.cancel(ref)
        return sink.ordered()

    map_keyed.__doc__ = Executor.map_keyed.__doc__


def get_executor(executor="local", *, ray_address: str | None = None, num_cpus: float = 1,
                 num_gpus: float = 0, max_retries: int = 3, n_jobs: int | None = None,
                 **ray_kwargs) -> Executor:
    """The executor named by ``executor`` (the ``--executor`` / ``--ray-address`` CLI flags).

    Parameters
    ----------
    executor : {"local", "ray"} or Executor, default "local"
        An :class:`Executor` instance is returned as it is (then the other arguments must keep
        their defaults).
    ray_address : str, optional
        ``address`` of :class:`RayExecutor`; only with ``executor="ray"``.
    num_cpus, num_gpus, max_retries, **ray_kwargs
        Passed to :class:`RayExecutor` (``runtime_env``, ``init_kwargs``); only with
        ``executor="ray"``.
    n_jobs : int, optional
        Worker processes of :class:`LocalExecutor` (``-1``: every CPU); only with
        ``executor="local"``. Default: the tasks run one after the other in this process.

    Returns
    -------
    Executor

    Raises
    ------
    ValueError
        Unknown name; Ray options with ``executor="local"`` or with an instance; ``n_jobs``
        with ``executor="ray"`` or with an instance; ``n_jobs == 0``.
    TypeError
        ``executor`` neither a str nor an Executor.

    Examples
    --------
    >>> get_executor()
    LocalExecutor()
    >>> get_executor("ray", ray_address="auto", num_cpus=2)  # Ray is imported at first use
    RayExecutor(address='auto', num_cpus=2, num_gpus=0, max_retries=3)
    """
    custom = ray_address is not None or num_cpus != 1 or num_gpus != 0 or max_retries != 3 or ray_kwargs
    if isinstance(executor, Executor):
        if custom or n_jobs is not None:
            raise ValueError("ray_address, num_cpus, num_gpus, max_retries, n_jobs: set them on the "
                             "Executor instance")
        return executor
    if not isinstance(executor, str):
        raise TypeError(f"executor: expected 'local', 'ray' or an Executor, got {type(executor).__name__}")
    if executor == "local":
        if custom:
            raise ValueError(
                "ray_address, num_cpus, num_gpus, max_retries: only with executor='ray' "
                f"(got executor='local', ray_address={ray_address!r})"
            )
        return LocalExecutor(n_jobs)
    if executor == "ray":
        if n_jobs is not None:
            raise ValueError("n_jobs: only with executor='local' (Ray sizes its tasks with num_cpus)")
        return RayExecutor(ray_address, num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries, **ray_kwargs)
    raise ValueError(f"executor: expected one of {_EXECUTOR_NAMES} or an Executor, got {executor!r}")


@contextmanager
def executor_scope(executor="local", n_jobs: int | None = None):
    """``with executor_scope(executor) as ex``: the executor of :func:`get_executor`, closed at
    the end only when it was made here from a name (an instance passed in stays open).

    Parameters
    ----------
    executor : {"local", "ray"} or Executor, default "local"
    n_jobs : int, optional
        Worker processes of the local executor (:class:`LocalExecutor`); only with
        ``executor="local"``.

    Yields
    ------
    Executor

    Raises
    ------
    TypeError, ValueError
        As :func:`get_executor`.
    """
    ex = get_executor(executor, n_jobs=n_jobs)
    try:
        yield ex
    finally:
        if ex is not executor:
            ex.close()


def map_keyed(fn, tasks, *, executor="local", **kw) -> dict:
    """Functional front door: ``get_executor(executor).map_keyed(fn, tasks, **kw)``.

    Parameters
    ----------
    fn, tasks, **kw
        See :meth:`Executor.map_keyed`.
    executor : {"local", "ray"} or Executor, default "local"
        A name starts (and, for Ray, afterwards shuts down) a fresh executor; pass an instance
        to reuse one connection across maps.

    Returns
    -------
    dict
        ``{key: result}`` in the order of ``tasks``.
    """
    if isinstance(executor, Executor):
        return executor.map_keyed(fn, tasks, **kw)
    with get_executor(executor) as ex:
        return ex.map_keyed(fn, tasks, **kw)


# --------------------------------------------------------------------------------------------
# command-line flags
# --------------------------------------------------------------------------------------------
def add_executor_arguments(parser, *, n_jobs: int = -1, device_option: str | None = None) -> None:
    """Add ``--executor {local,ray}``, ``--n-jobs``, ``--ray-address``, ``--ray-num-cpus`` and
    ``--ray-num-gpus`` to an ``argparse`` parser (read them back with :func:`executor_from_args`).

    ``n_jobs`` is the default of ``--n-jobs`` (-1: every CPU; 1 for commands whose tasks hold a
    model each, such as cramming, where a pool would load it once per worker).
    ``device_option`` names the parser's own torch-device flag (e.g. ``"--device"``), whose
    value :func:`executor_from_args` is then given: ``--ray-num-gpus``'s help says that a cuda
    device asks for one GPU per task. None (a parser without one): the help says 0, which is
    what :func:`executor_from_args` without a ``device`` takes.
    """
    group = parser.add_argument_group("execution")
    group.add_argument("--executor", choices=_EXECUTOR_NAMES, default="local",
                       help="run the loops over tokens/samples/targets here (local) or on a Ray cluster")
    # default None, so that --n-jobs given with --executor ray can be refused; the command's
    # default is kept beside it for executor_from_args
    group.add_argument("--n-jobs", type=int, default=None,
                       help="local worker processes for the loops over tokens, samples or targets "
                            "(-1: every CPU; 1: one after the other in this process); the results are "
                            f"the same for every value (default {n_jobs}; only with --executor local)")
    parser.set_defaults(n_jobs_default=n_jobs)
    group.add_argument("--ray-address", default=None,
                       help="Ray cluster address (e.g. auto, HOST:6379, ray://HOST:10001); default "
                            "RAY_ADDRESS, else a new local cluster")
    group.add_argument("--ray-num-cpus", type=float, default=1.0, help="CPUs per Ray task")
    gpus_default = ("0" if device_option is None else
                    f"1 with {device_option} cuda, else 0")
    group.add_argument("--ray-num-gpus", type=float, default=None,
                       help=f"GPUs per Ray task (default {gpus_default})")


def executor_from_args(args, *, device: str | None = None) -> Executor:
    """The executor of parsed CLI flags (:func:`add_executor_arguments`).

    Parameters
    ----------
    args : argparse.Namespace
    device : str, optional
        The torch device of the command; ``"cuda..."`` makes each Ray task request one GPU
        unless ``--ray-num-gpus`` says otherwise.

    Returns
    -------
    Executor

    Raises
    ------
    ValueError
        ``--ray-address`` or resource flags given with ``--executor local``; ``--n-jobs 0``;
        ``--n-jobs`` given with ``--executor ray`` (Ray sizes its tasks with ``--ray-num-cpus``).
    """
    gpus = args.ray_num_gpus
    if gpus is None:
        gpus = 1.0 if (args.executor == "ray" and device is not None and str(device).startswith("cuda")) else 0.0
    if args.executor == "local":
        if args.ray_address is not None or args.ray_num_cpus != 1.0 or gpus != 0.0:
            raise ValueError("--ray-address, --ray-num-cpus, --ray-num-gpus: only with --executor ray")
        n_jobs = getattr(args, "n_jobs", None)
        if n_jobs is None:
            n_jobs = getattr(args, "n_jobs_default", None)
        if n_jobs == 0:
            raise ValueError("--n-jobs: expected a non-zero int (-1 for every CPU), got 0")
        return LocalExecutor(n_jobs)
    if getattr(args, "n_jobs", None) is not None:
        raise ValueError("--n-jobs: only with --executor local (Ray sizes its tasks with "
                         "--ray-num-cpus)")
    return RayExecutor(args.ray_address, num_cpus=args.ray_num_cpus, num_gpus=gpus)

