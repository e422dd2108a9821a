"""The one JSON converter of embgeom: strict JSON, one rule for NaN and infinity.

Every file embgeom writes as JSON (``report.json``, ``cram_summary.json``, the lines of
``cram.jsonl``, ``copy_summary.json``, a checkpoint's ``copy_task.json``) goes through
:func:`to_jsonable` and is written with ``allow_nan=False``, so any strict parser reads it
(``json.loads(text, parse_constant=...)`` never sees ``NaN`` or ``Infinity``).

The rule for numbers that are not finite: **NaN, +inf and -inf become ``null``**. JSON has no
such numbers; a string such as ``"NaN"`` would turn a numeric field into a mixed-type one that
every reader must special-case. Each key that can hold a non-finite value says in its
documentation what ``null`` means there (for example ``n50`` is ``null`` when the curve is
censored, a bootstrap bound is ``null`` when a resampled curve never crosses 0.5).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

__all__ = ["to_jsonable", "dumps", "dump"]


def to_jsonable(obj):
    """A copy of ``obj`` made of plain JSON types only (dict, list, str, int, float, bool, None).

    Parameters
    ----------
    obj : object
        Nested dicts, lists, tuples, sets (sorted), numpy scalars and arrays, ``pathlib.Path``,
        dataclasses, objects with a ``to_dict()`` method, and plain JSON values.

    Returns
    -------
    object
        Dict keys as ``str``; numpy integers/bools/floats as Python ``int``/``bool``/``float``;
        arrays as nested lists; paths as ``str``; **NaN and +-inf as ``None``** (the module's one
        rule, see the module docstring).

    Raises
    ------
    TypeError
        An object of another type (a torch tensor, a function, ...), with the path to it.
    """
    return _convert(obj, "$")


def _convert(obj, where: str):
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, dict):
        return {str(k): _convert(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_convert(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [_convert(v, f"{where}[]") for v in sorted(obj)]
    if isinstance(obj, np.ndarray):
        return _convert(obj.tolist(), where)
    if isinstance(obj, (Path, os.PathLike)):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if callable(getattr(obj, "to_dict", None)):
            return _convert(obj.to_dict(), where)
        return _convert(dataclasses.asdict(obj), where)
    if callable(getattr(obj, "to_dict", None)):
        return _convert(obj.to_dict(), where)
    raise TypeError(f"not JSON serialisable at {where}: {type(obj).__name__}")


def dumps(obj, **kwargs) -> str:
    """``json.dumps(to_jsonable(obj), allow_nan=False, **kwargs)``: strict JSON text.

    Raises
    ------
    TypeError
        As :func:`to_jsonable`.
    """
    kwargs.setdefault("allow_nan", False)
    return json.dumps(to_jsonable(obj), **kwargs)


def dump(obj, path, *, indent: int | None = 2) -> Path:
    """Write ``obj`` as strict JSON to the file ``path`` (created or replaced); returns the path.

    Raises
    ------
    TypeError
        As :func:`to_jsonable`.
    """
    path = Path(path)
    text = dumps(obj, indent=indent)
    path.write_text(text + "\n")
    return path
