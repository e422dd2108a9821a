"""When to draw tqdm progress bars.

A bar redraws itself with carriage returns: on a terminal that is one moving line, in a log file
it is one line of tens of kilobytes. So the command line, and any code that passes
``**tqdm_kwargs(progress)`` to ``tqdm``, draws bars only when the stream is a terminal.
"""

from __future__ import annotations

import sys


__all__ = ["check_progress", "progress_enabled", "tqdm_kwargs"]

#: seconds between two redraws of a bar (tqdm's default is 0.1)
MIN_INTERVAL_S = 0.5


def check_progress(progress, name: str = "progress") -> bool:
    """``progress`` as a bool: True or False (numpy's bool too), else a TypeError naming
    ``name``. A string such as ``"no"`` is truthy and would draw bars, so it is refused."""
    from ._validation import check_bool

    return check_bool(progress, name)


def progress_enabled(requested: bool = True, stream=None) -> bool:
    """Whether to draw progress bars: ``requested`` and ``stream`` is a terminal.

    Parameters
    ----------
    requested : bool, default True
        The caller's wish (``False`` for ``--no-progress`` or ``--quiet``).
    stream : file-like, optional
        Where the bars go; default ``sys.stderr`` (tqdm's default).

    Returns
    -------
    bool
        ``False`` when not requested, when ``stream`` is ``None`` (no stderr, as under
        ``pythonw``) or when it is not a terminal (a log file, a pipe, a CI job).

    Examples
    --------
    >>> import io
    >>> progress_enabled(True, io.StringIO())
    False
    >>> progress_enabled(False)
    False
    """
    if not check_progress(requested):
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed stream
        return False


def tqdm_kwargs(progress: bool = True, stream=None) -> dict:
    """Keyword arguments for ``tqdm``: off unless requested and ``stream`` is a terminal.

    Parameters
    ----------
    progress : bool, default True
        The caller's wish.
    stream : file-like, optional
        Default ``sys.stderr``.

    Returns
    -------
    dict
        ``{"disable": bool, "mininterval": float}`` (``mininterval`` in seconds).

    Examples
    --------
    >>> import io
    >>> tqdm_kwargs(True, io.StringIO())["disable"]
    True
    """
    return {"disable": not progress_enabled(progress, stream), "mininterval": MIN_INTERVAL_S}
