"""The execution layer: keyed seeds, the local and Ray back ends, the chunked workloads.

The Ray tests run on one local cluster (``ray.init(address="local", num_cpus=2)``, started
once for the module). "Ray with 1 worker" asks 2 CPUs per task on that 2-CPU cluster (one task
at a time); "Ray with 2 workers" asks 1 CPU per task (two at a time). Every workload must give
bit-identical results on the local executor and on both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embgeom.cells import STATUS_NAMES, Decoder
from embgeom.parallel import LocalExecutor, RayExecutor, get_executor, map_keyed, task_seed
from embgeom.supports import Ball, Box
from embgeom.volumes import cell_volumes


STALL = 180.0  # seconds without a finished task before a Ray map fails

# --------------------------------------------------------------------------------------------
# task functions (module level: Ray ships them by reference)
# --------------------------------------------------------------------------------------------
def _draws(n, *, scale, seed, delay=0.0):
    """A seeded task: n Gaussian draws from the task's own SeedSequence, the worker's pid."""
    time.sleep(delay)
    return np.random.default_rng(seed).standard_normal(n) * scale, os.getpid()


def _row_sums(i, *, W, seed):
    """Reads a shared array; reports whether it arrived as a read-only (object-store) buffer."""
    rng = np.random.default_rng(seed)
    return float(W[i].sum() + rng.uniform()), bool(W.flags.writeable)


def _last_first(i, *, signal_file):
    """Task 0 waits (up to 60 s) until the last task has written ``signal_file``: on two workers
    it finishes after every other task. Returns (i*i, end time)."""
    if i == 0:
        deadline = time.time() + 60
        while not os.path.exists(signal_file) and time.time() < deadline:
            time.sleep(0.02)
    elif i == 4:
        open(signal_file, "w").close()
    return i * i, time.time()


def _dies_once(i, *, marker, seed):
    """Task 2 kills its own worker process the first time it runs (``marker`` records that)."""
    if i == 2 and marker is not None and not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return np.random.default_rng(seed).integers(0, 2**62, size=4)


def _same(a, b):
    """Bit-identical nested results (arrays compared exactly, dtype included)."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


# --------------------------------------------------------------------------------------------
# no Ray needed
# --------------------------------------------------------------------------------------------
def test_task_seed_is_spawn_for_integer_keys_and_distinct_otherwise():
    root = np.random.SeedSequence(12345)
    kids = np.random.SeedSequence(12345).spawn(6)
    for i in range(6):
        assert np.array_equal(task_seed(root, i).generate_state(4), kids[i].generate_state(4))
    assert root.n_children_spawned == 0  # task_seed spawns nothing
    keys = [0, 1, (0, 1), (1, 0), "0", "gemma", ("gemma", 1, 8), ("gemma", 8, 1), 2**40, -1, 0.5, None]
    states = {tuple(task_seed(7, k).generate_state(4)) for k in keys}
    assert len(states) == len(keys)
    assert np.array_equal(task_seed(7, np.int64(3)).generate_state(2), task_seed(7, 3).generate_state(2))


def test_task_seed_of_a_str_key_is_the_same_in_another_process():
    # the derivation must not use Python's per-process salted hash()
    code = ("from embgeom.parallel import task_seed; "
            "print(task_seed(3, ('smollm2', 4, 'x')).generate_state(3).tolist())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.strip() == str(task_seed(3, ("smollm2", 4, "x")).generate_state(3).tolist())


def test_import_embgeom_stays_ray_free():
    code = (
        "import sys, embgeom, embgeom.parallel, embgeom.cells._scan, embgeom.volumes\n"
        "from embgeom.parallel import get_executor\n"
        "ex = get_executor('ray', ray_address='auto')\n"  # constructing does not import Ray
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.strip() == "False"


def test_local_map_is_keyed_and_calls_back_in_task_order():
    seen = []
    tasks = {"b": (3,), "a": (2,), ("c", 1): (1,)}
    out = LocalExecutor().map_keyed(_draws, tasks, kwargs={"scale": 2.0}, seed=5,
                                    on_result=lambda k, v: seen.append(k), progress=False)
    assert list(out) == list(tasks) == seen
    for key, (n,) in tasks.items():
        want = np.random.default_rng(task_seed(5, key)).standard_normal(n) * 2.0
        assert np.array_equal(out[key][0], want)
    assert map_keyed(_draws, {}, kwargs={"scale": 1.0}, progress=False) == {}


def test_bad_arguments_are_refused():
    ex = LocalExecutor()
    with pytest.raises(TypeError, match="tasks"):
        ex.map_keyed(_draws, [(1,)], progress=False)
    with pytest.raises(TypeError, match=r"tasks\[0\]"):
        ex.map_keyed(_draws, {0: 1}, progress=False)
    with pytest.raises(TypeError, match="task key"):
        ex.map_keyed(_draws, {frozenset([1]): (1,)}, progress=False)
    with pytest.raises(ValueError, match="given twice"):
        ex.map_keyed(_draws, {0: (1,)}, shared={"scale": 1.0}, kwargs={"scale": 2.0}, progress=False)
    with pytest.raises(ValueError, match="given twice"):
        ex.map_keyed(_draws, {0: (1,)}, kwargs={"seed": 1, "scale": 1.0}, seed=3, progress=False)
    with pytest.raises(ValueError, match="seed"):
        ex.map_keyed(_draws, {0: (1,)}, kwargs={"scale": 1.0}, seed=-1, progress=False)
    with pytest.raises(TypeError, match="seed"):
        ex.map_keyed(_draws, {0: (1,)}, kwargs={"scale": 1.0}, seed=1.5, progress=False)
    with pytest.raises(ValueError, match="executor"):
        get_executor("dask")
    with pytest.raises(ValueError, match="only with executor='ray'"):
        get_executor("local", ray_address="auto")
    with pytest.raises(ValueError, match="num_gpus"):
        RayExecutor(num_gpus=-1)
    with pytest.raises(ValueError, match="chunk_size"):
        Decoder(np.eye(3, dtype=np.float32)).unargmaxable(chunk_size=0, progress=False)
    with pytest.raises(ValueError, match="executor"):
        Decoder(np.eye(3, dtype=np.float32)).unargmaxable(executor="dask", progress=False)
    with pytest.raises(ValueError, match="executor"):
        cell_volumes(Decoder(np.eye(3, dtype=np.float32)), Ball.from_params(None, 1.0, dim=3), 10, 0,
                     executor="threads", progress=False)


def test_command_line_flags_pick_the_executor():
    import argparse

    from embgeom.parallel import add_executor_arguments, executor_from_args

    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    assert isinstance(executor_from_args(parser.parse_args([]), device="cuda"), LocalExecutor)
    ex = executor_from_args(parser.parse_args(["--executor", "ray", "--ray-address", "auto"]), device="cuda:0")
    assert isinstance(ex, RayExecutor) and ex.address == "auto" and ex.num_gpus == 1 and ex.num_cpus == 1
    ex = executor_from_args(parser.parse_args(["--executor", "ray", "--ray-num-gpus", "0.5"]), device="cuda")
    assert ex.num_gpus == 0.5 and ex.address is None
    assert executor_from_args(parser.parse_args(["--executor", "ray"]), device="cpu").num_gpus == 0
    with pytest.raises(ValueError, match="only with --executor ray"):
        executor_from_args(parser.parse_args(["--ray-address", "auto"]))


@pytest.mark.parametrize("command", [["report", "--quick"], ["cram", "--mem", "1"]])
def test_report_and_cram_take_the_executor_flags(command, tmp_path, capsys, monkeypatch):
    import embgeom.adapters
    from embgeom.cli import build_parser, main

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(embgeom.adapters, "load_model", refuse)

    args = build_parser().parse_args([*command, "--out", str(tmp_path), "--executor", "ray",
                                      "--ray-address", "auto"])
    assert args.executor == "ray" and args.ray_address == "auto"
    # a Ray flag without --executor ray: one line and exit 2, before any model is loaded
    assert main([*command, "--out", str(tmp_path), "--ray-address", "auto"]) == 2
    assert "only with --executor ray" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# the local process pool (n_jobs)
# --------------------------------------------------------------------------------------------
def _fails_at(i, *, bad):
    if i == bad:
        raise ValueError(f"task {i} failed on purpose")
    return i


def _blas_threads(i):
    """The BLAS thread limit inside the worker, and its pid."""
    from threadpoolctl import threadpool_info

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"], os.getpid()


def test_local_pool_gives_the_serial_results_in_task_order():
    tasks = {k: (40 + k,) for k in range(5)}
    serial = LocalExecutor().map_keyed(_draws, tasks, kwargs={"scale": 3.0}, seed=2026, progress=False)
    order = []
    # task 0 sleeps: on two workers it finishes after the others, and is still released first
    pooled = LocalExecutor(n_jobs=2).map_keyed(
        _draws, tasks, kwargs={"scale": 3.0}, seed=2026, progress=False,
        on_result=lambda k, v: order.append(k))
    assert list(pooled) == order == list(tasks)
    assert _same([v[0] for v in pooled.values()], [v[0] for v in serial.values()])
    pids = {pid for _, pid in pooled.values()}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # ran in (at most two) workers
    assert {pid for _, pid in serial.values()} == {os.getpid()}
    # a single task runs here: no pool to start
    one = LocalExecutor(n_jobs=2).map_keyed(_draws, {0: (3,)}, kwargs={"scale": 1.0}, seed=1, progress=False)
    assert one[0][1] == os.getpid()


def _shared_view(i, *, W, small, seed):
    """Reads a large and a small shared array in a pool worker: the row sum, whether the large one
    is a read-only memory map of a file, and the worker's state dict between tasks."""
    from embgeom.parallel import worker_state

    state = worker_state()
    state["tasks"] = state.get("tasks", 0) + 1
    return float(W[i].astype(np.float64).sum() + small[i % small.size]), bool(W.flags.writeable), \
        isinstance(W.base, np.memmap), state["tasks"], os.getpid()


def test_local_pool_maps_large_shared_arrays_read_only_and_removes_their_files(tmp_path, monkeypatch):
    import tempfile

    from embgeom import parallel
    from embgeom.parallel import worker_state

    made = []
    real = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(real(**kw)) or made[-1])
    rng = np.random.default_rng(0)
    W = rng.standard_normal((3000, 200)).astype(np.float32)  # 2.4 MB: above MMAP_MIN_BYTES
    assert W.nbytes >= parallel.MMAP_MIN_BYTES
    small = np.arange(5.0)
    tasks = {i: (i,) for i in range(6)}
    serial = LocalExecutor().map_keyed(_row_sums, tasks, shared={"W": W}, seed=3, progress=False)
    pooled = LocalExecutor(n_jobs=2).map_keyed(_shared_view, tasks, shared={"W": W, "small": small},
                                               seed=3, progress=False)
    for i in tasks:
        total, writeable, mapped, n_tasks, pid = pooled[i]
        assert total == float(W[i].astype(np.float64).sum() + small[i % 5])
        assert not writeable and mapped and pid != os.getpid()
    # a worker's state dict lives between its tasks: its counts run 1, 2, ... per worker
    by_pid = {}
    for i in tasks:
        by_pid.setdefault(pooled[i][4], []).append(pooled[i][3])
    assert all(sorted(c) == list(range(1, len(c) + 1)) for c in by_pid.values())
    assert serial and worker_state() is None  # the caller's process keeps no state
    assert made and not any(os.path.exists(d) for d in made)  # the mapped files are gone


def test_local_pool_propagates_a_task_error_and_limits_worker_threads():
    with pytest.raises(ValueError, match="task 2 failed on purpose"):
        LocalExecutor(n_jobs=2).map_keyed(_fails_at, {i: (i,) for i in range(4)}, kwargs={"bad": 2},
                                          progress=False)
    from embgeom.parallel import _n_cpus

    out = LocalExecutor(n_jobs=2).map_keyed(_blas_threads, {i: (i,) for i in range(2)}, progress=False)
    for threads, _ in out.values():
        assert threads and all(t == max(1, _n_cpus() // 2) for t in threads)


def test_n_jobs_is_checked_and_follows_scikit_learn():
    from embgeom.parallel import _n_cpus, effective_n_jobs, executor_scope

    assert effective_n_jobs(None) == effective_n_jobs(1) == 1
    assert effective_n_jobs(-1) == _n_cpus() and effective_n_jobs(-(_n_cpus() + 5)) == 1
    assert effective_n_jobs(np.int64(3)) == 3
    with pytest.raises(ValueError, match="n_jobs"):
        LocalExecutor(n_jobs=0)
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="n_jobs"):
            LocalExecutor(n_jobs=bad)
    with pytest.raises(ValueError, match="n_jobs: only with executor='local'"):
        get_executor("ray", n_jobs=2)
    with pytest.raises(ValueError, match="n_jobs"):
        get_executor(LocalExecutor(), n_jobs=2)
    with executor_scope("local", n_jobs=2) as ex:
        assert isinstance(ex, LocalExecutor) and ex.n_workers == 2
    with pytest.raises(ValueError, match="n_jobs"):
        cell_volumes(Decoder(np.eye(3, dtype=np.float32)), Ball.from_params(None, 1.0, dim=3), 10, 0,
                     n_jobs=0, progress=False)
    import argparse

    from embgeom.parallel import add_executor_arguments, executor_from_args

    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    assert executor_from_args(parser.parse_args([])).n_workers == _n_cpus()  # default -1
    assert executor_from_args(parser.parse_args(["--n-jobs", "2"])).n_workers == 2
    with pytest.raises(ValueError, match="--n-jobs"):
        executor_from_args(parser.parse_args(["--n-jobs", "0"]))


def test_cell_volumes_and_the_scan_on_a_pool_equal_the_serial_run():
    from embgeom import volumes

    rng = np.random.default_rng(5)
    W = rng.standard_normal((30, 4)).astype(np.float32)
    dec, ball = Decoder(W), Ball.from_params(None, 1.0, dim=4)
    ids = np.array([0, 3, 7, 12, 29])
    kw = dict(seed=4, tokens=ids, n_chains=32, progress=False, method="rare-event", target_se=None)
    serial = cell_volumes(dec, ball, 3 * 8192, batch_size=8192, **kw)
    pooled = cell_volumes(dec, ball, 3 * 8192, batch_size=8192, n_jobs=2, **kw)
    assert volumes._rare_event_chunk_size(ids.size, 2) == 1  # five tasks of one token
    np.testing.assert_array_equal(pooled.counts, serial.counts)
    for f in ("log_fractions", "log_lower", "log_upper", "token_method"):
        np.testing.assert_array_equal(getattr(pooled, f), getattr(serial, f), err_msg=f)
    assert np.isfinite(serial.log_fractions[ids]).all()
    dec2 = Decoder(_small_W())
    whole = dec2.unargmaxable(progress=False)
    got = dec2.unargmaxable(chunk_size=64, batch_size=32, executor=LocalExecutor(n_jobs=2), progress=False)
    assert np.array_equal(got.status, whole.status) and np.array_equal(got.tokens, whole.tokens)


# --------------------------------------------------------------------------------------------
# on a local Ray cluster
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # address="local": a new 2-CPU cluster even where RAY_ADDRESS points elsewhere
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the task functions of this file travel by value: the workers cannot import a test module
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def executors(ray_cluster):
    """local, Ray with one task at a time, Ray with two at a time (the cluster has 2 CPUs)."""
    # stall_timeout: a cluster that lost its workers (e.g. to a machine-wide OOM) fails, not hangs
    return {"local": LocalExecutor(), "ray1": RayExecutor(num_cpus=2, stall_timeout=STALL),
            "ray2": RayExecutor(num_cpus=1, stall_timeout=STALL)}


def test_seeded_workload_is_identical_on_every_executor(executors):
    # task 0 sleeps: on two workers it finishes after the others
    tasks = {k: (50 + k,) for k in range(6)}
    runs = {}
    for name, ex in executors.items():
        order = []
        runs[name] = ex.map_keyed(_draws, tasks, kwargs={"scale": 3.0, "delay": 0.0}, seed=2026,
                                  on_result=lambda k, v: order.append(k), progress=False)
        assert order == list(tasks)
    for name in ("ray1", "ray2"):
        assert list(runs[name]) == list(tasks)
        assert _same([v[0] for v in runs[name].values()], [v[0] for v in runs["local"].values()])
        assert all(pid != os.getpid() for _, pid in runs[name].values())  # ran in workers
    # keyed, not positional: a subset of keys (a resumed run) draws the same numbers
    rest = {k: tasks[k] for k in (4, 1)}
    again = executors["ray2"].map_keyed(_draws, rest, kwargs={"scale": 3.0}, seed=2026, progress=False)
    assert list(again) == [4, 1]
    assert all(np.array_equal(again[k][0], runs["local"][k][0]) for k in rest)


def test_results_are_released_in_task_order_when_they_arrive_out_of_order(executors, tmp_path):
    released = []
    tasks = {i: (i,) for i in range(5)}
    out = executors["ray2"].map_keyed(_last_first, tasks, kwargs={"signal_file": str(tmp_path / "go")},
                                      progress=False, on_result=lambda k, v: released.append(k))
    ends = [out[i][1] for i in range(5)]
    assert ends[0] > max(ends[1:])  # the scenario: task 0 really finished last
    assert [out[i][0] for i in range(5)] == [i * i for i in range(5)]
    assert list(out) == released == list(range(5))


def test_shared_array_goes_to_the_object_store_once(executors):
    W = np.random.default_rng(1).standard_normal((2000, 64)).astype(np.float32)
    local = executors["local"].map_keyed(_row_sums, {i: (i,) for i in range(4)}, shared={"W": W}, seed=0,
                                         progress=False)
    ex = executors["ray2"]
    ref = ex.put(W)  # put once, reuse across maps
    remote = ex.map_keyed(_row_sums, {i: (i,) for i in range(4)}, shared={"W": ref}, seed=0, progress=False)
    assert [v[0] for v in remote.values()] == [v[0] for v in local.values()]
    assert all(v[1] for v in local.values())
    assert not any(v[1] for v in remote.values())  # zero-copy read-only views of the stored array


def _small_W(seed=0):
    """300 rows in d = 8 (about 80 of them inside the hull: the LP phase runs) plus planted rows
    inside the hull (convex combinations) and a duplicate."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((300, 8))
    W[10] = 0.5 * W[20] + 0.5 * W[30]
    W[11] = 0.2 * W[40] + 0.3 * W[50] + 0.5 * W[60]
    W[12] = W[70]  # a duplicate of a higher id: 12 wins ties, 70 is the duplicate
    return W.astype(np.float32)


def test_unargmaxable_scan_is_identical_on_every_executor(executors):
    dec = Decoder(_small_W())
    whole = dec.unargmaxable(progress=False, chunk_size=10_000)  # one witness task, one LP task
    runs = {name: dec.unargmaxable(chunk_size=64, batch_size=32, executor=ex, progress=False)
            for name, ex in executors.items()}
    for name, res in runs.items():
        assert res.extra["executor"] == ("local" if name == "local" else "ray")
        # exact verdicts, and chunks aligned with the serial batches: the same status codes
        assert np.array_equal(res.status, whole.status), name
        assert np.array_equal(res.tokens, whole.tokens), name
        assert res.n_lp == whole.n_lp and res.n_undecided == 0
        assert res.extra["lp_iterations_mean"] == whole.extra["lp_iterations_mean"]
    assert {10, 11, 70} <= set(whole.tokens.tolist()) and 12 not in whole.tokens
    assert whole.status_of(70) == "duplicate"
    assert whole.n_lp > 64 and {"lp_empty", "lp_witness"} <= {whole.status_of(t) for t in range(300)}
    # the global LP cap applies in token order, as in one call, whatever the chunks
    capped = dec.unargmaxable(max_lp=40, progress=False)
    for ex in executors.values():
        got = dec.unargmaxable(max_lp=40, chunk_size=64, batch_size=32, executor=ex, progress=False)
        assert np.array_equal(got.status, capped.status) and got.n_undecided == whole.n_lp - 40
    # a token subset: the others are "skipped"
    ids = [11, 70, 5, 0, 299]
    sub = dec.unargmaxable(tokens=ids, chunk_size=2, batch_size=1, executor=executors["ray2"], progress=False)
    assert sub.tokens.tolist() == sorted(set(ids) & set(whole.tokens.tolist()))
    assert (sub.status == STATUS_NAMES.index("skipped")).sum() == 300 - len(ids)
    empty = [STATUS_NAMES.index("lp_empty"), STATUS_NAMES.index("duplicate")]
    assert np.array_equal(np.isin(sub.status[ids], empty), np.isin(whole.status[ids], empty))


def test_cell_volume_counts_are_identical_on_every_executor(executors):
    rng = np.random.default_rng(3)
    W = rng.standard_normal((400, 8)).astype(np.float32)
    cases = [(Decoder(W), Ball.from_params(None, 1.0, dim=8)),  # cones: Gaussian directions
             (Decoder(W, rng.standard_normal(400).astype(np.float32)), Box.from_params(-np.ones(8), np.ones(8)))]
    for dec, support in cases:
        n = 2 * 8192 + 1000  # three blocks, the last one short
        serial = cell_volumes(dec, support, n, seed=11, batch_size=n, progress=False,
                              method="uniform").counts  # one task
        for name, ex in executors.items():  # three tasks of one block each
            got = cell_volumes(dec, support, n, seed=11, batch_size=8192, executor=ex, progress=False,
                               method="uniform")
            assert got.counts.dtype == np.int64 and np.array_equal(got.counts, serial), name
            assert got.extra["executor"] == ("local" if name == "local" else "ray")


def test_rare_event_cell_volumes_are_identical_on_every_executor(executors):
    """Rare-event log-shares: token chunks as tasks, each token with its own seed."""
    from embgeom import volumes

    rng = np.random.default_rng(5)
    W = rng.standard_normal((30, 4)).astype(np.float32)
    dec, ball = Decoder(W), Ball.from_params(None, 1.0, dim=4)
    ids = np.array([0, 3, 7, 12, 29])
    old = volumes.RARE_EVENT_CHUNK
    volumes.RARE_EVENT_CHUNK = 2  # three tasks
    try:
        runs = {name: cell_volumes(dec, ball, 100, seed=4, tokens=ids, n_chains=32, executor=ex,
                                   progress=False, method="rare-event")
                for name, ex in executors.items()}
    finally:
        volumes.RARE_EVENT_CHUNK = old
    one_task = cell_volumes(dec, ball, 100, seed=4, tokens=ids, n_chains=32, progress=False,
                            method="rare-event")
    for name, cv in runs.items():
        for f in ("log_fractions", "log_lower", "log_upper"):
            np.testing.assert_array_equal(getattr(cv, f), getattr(one_task, f), err_msg=name)
    assert np.isfinite(one_task.log_fractions[ids]).all()


def test_killed_worker_is_retried_and_the_results_equal_the_local_run(executors, tmp_path):
    tasks = {i: (i,) for i in range(5)}
    local = executors["local"].map_keyed(_dies_once, tasks, kwargs={"marker": None}, seed=77, progress=False)
    marker = tmp_path / "died"
    ex = RayExecutor(num_cpus=1, max_retries=2, stall_timeout=STALL)
    out = ex.map_keyed(_dies_once, tasks, kwargs={"marker": str(marker)}, seed=77, progress=False)
    assert marker.exists() and int(marker.read_text()) != os.getpid()  # a worker really died
    assert _same(out, local)
    # without retries the same death is an error, not a silent gap
    from ray.exceptions import WorkerCrashedError

    with pytest.raises(WorkerCrashedError):
        RayExecutor(num_cpus=1, max_retries=0, stall_timeout=STALL).map_keyed(
            _dies_once, tasks, kwargs={"marker": str(tmp_path / "died2")}, seed=77, progress=False)


# --------------------------------------------------------------------------------------------
# the cramming sweep on a tiny random Llama (as in tests/test_cramming.py)
# --------------------------------------------------------------------------------------------
def _tiny_llama():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      initializer_range=0.3, tie_word_embeddings=False, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


_SWEEP = dict(lengths=[2, 4, 8], n_targets=3, steps=30, lr=0.05, seed=0, adaptive=True, max_length=8,
              batch_size=1, n_boot=0, plot=False, progress=False)


def _records(path):
    """{(m, n, target index): record without its wall times}, and the number of lines."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    recs = {(r["n_mem"], r["length"], r["target_index"]):
            {k: v for k, v in r.items() if k not in ("wall_s", "batch_wall_s")} for r in lines}
    return recs, len(lines)


@pytest.fixture(scope="module")
def cram_local(tmp_path_factory):
    """The tiny sweep run locally in this process (one torch thread, as a Ray worker has)."""
    import torch

    from embgeom.cramming import run_cram

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = _tiny_llama()
        out = tmp_path_factory.mktemp("cram_local")
        summary = run_cram(model, [1, 2], out, **_SWEEP)
    finally:
        torch.set_num_threads(old)
    return model, summary, _records(out / "cram.jsonl")


def test_cramming_sweep_on_ray_gives_the_local_records(cram_local, executors, tmp_path):
    from embgeom.cramming import run_cram

    model, summary, (want, n_lines) = cram_local
    assert n_lines == len(want) >= 12  # the adaptive search ran several lengths per m
    out = tmp_path / "ray"
    got = run_cram(model, [1, 2], out, executor=executors["ray2"], **_SWEEP)
    recs, n = _records(out / "cram.jsonl")
    assert n == n_lines and recs == want  # bit-identical verdicts, losses, steps, settings hash
    assert got["curves"] == summary["curves"] and got["n50"] == summary["n50"]
    # the file order is the task order, not the completion order
    assert _ordered_keys(out / "cram.jsonl") == _ordered_keys(Path(summary["files"]["jsonl"]))


def _ordered_keys(path):
    return [(r["n_mem"], r["length"], r["target_index"]) for r in map(json.loads, path.read_text().splitlines())]


def test_cramming_sweep_killed_mid_way_resumes_without_loss_or_double_count(cram_local, ray_cluster, tmp_path):
    import threading

    import psutil

    from embgeom.cramming import run_cram

    model, summary, (want, n_lines) = cram_local
    out = tmp_path / "killed"
    jsonl = out / "cram.jsonl"
    failure = []

    def sweep():
        try:  # no retries: the killed task ends the run, as a lost node or Ctrl-C would
            run_cram(model, [1, 2], out, executor=RayExecutor(num_cpus=1, max_retries=0, stall_timeout=STALL),
                     **_SWEEP)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            failure.append(exc)

    th = threading.Thread(target=sweep)
    th.start()
    killed = None
    deadline = time.time() + 120
    while killed is None and th.is_alive() and time.time() < deadline:
        if jsonl.exists() and jsonl.read_text().count("\n") >= 2:  # some results are in
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if cmd and cmd[0].startswith("ray::_run_task"):
                    proc.kill()
                    killed = proc.pid
                    break
        time.sleep(0.02)
    th.join(timeout=180)
    assert killed is not None and not th.is_alive()
    from ray.exceptions import WorkerCrashedError

    assert failure and isinstance(failure[0], WorkerCrashedError)
    partial, n_partial = _records(jsonl)
    assert 2 <= n_partial < n_lines and n_partial == len(partial)
    assert all(partial[k] == want[k] for k in partial)  # what was written is right
    # the rerun crams only what is missing: every target once, the records of the local run
    again = run_cram(model, [1, 2], out, executor=RayExecutor(num_cpus=1, stall_timeout=STALL), **_SWEEP)
    recs, n = _records(jsonl)
    assert n == n_lines and recs == want
    assert again["curves"] == summary["curves"]
