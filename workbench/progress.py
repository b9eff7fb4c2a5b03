"""Progress bars: one per long command, drawn on a terminal or in a notebook, none on a pipe or file.

Every command's bar comes from `progress_bar`: on stderr when it is a terminal (tqdm's
`disable=None` test), as a widget in a Jupyter kernel that has ipywidgets, and as text on the
notebook's stderr in one that has not: `tqdm.auto` warns there ("IProgress not found") and
then draws nothing, since a kernel's stderr is no terminal (tqdm 4.70 tqdm/autonotebook.py).

`library_bars_off` silences transformers' and huggingface_hub's own bars ("Loading weights",
downloads) for `progress=False` and `-q`. Their switches are process-wide, so it restores them.
Only tqdm and, when silencing, those two libraries are imported: `analyses` uses this module too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import IO, Iterator

from tqdm.std import tqdm

__all__ = ["progress_bar", "library_bars_off", "in_notebook"]

# a terminal that reports no size (a pseudo-terminal nobody sized, as a test or an ssh -T session
# makes) gets a bar this many columns wide, on a screen this many rows high
FALLBACK_SIZE = (80, 24)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell), as tqdm/autonotebook.py asks."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress_bar(total: int | None = None, *, desc: str | None = None, unit: str = "it",
                 enabled: bool = True, file: IO[str] | None = None) -> tqdm:
    """A bar over `total` steps (update it with `.update(n)`); disabled when `enabled` is False,
    when `file` (default: the current stderr) is a pipe or a file, or outside a notebook's kernel."""
    if not enabled:
        return tqdm(total=total, disable=True)
    if in_notebook():
        from tqdm import notebook
        from tqdm.notebook import tqdm as notebook_tqdm

        # IProgress is None without ipywidgets (tqdm 4.67 tqdm/notebook.py imports it quietly)
        if getattr(notebook, "IProgress", None) is not None:
            return notebook_tqdm(total=total, desc=desc, unit=unit)
        # the notebook's output area honours the carriage returns of a text bar
        return tqdm(total=total, desc=desc, unit=unit, file=file or sys.stderr, disable=False,
                    ncols=FALLBACK_SIZE[0])
    stream = file or sys.stderr
    if _sized(stream):
        return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=None, dynamic_ncols=True)
    return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=None,
                ncols=FALLBACK_SIZE[0], nrows=FALLBACK_SIZE[1])


def _sized(stream: IO[str]) -> bool:
    """Whether `stream` is a terminal that reports its size (tqdm then follows it as it changes),
    or no terminal at all (the bar is off). A zero size would make tqdm draw nothing: with no
    rows, each bar is among the "more hidden" ones (tqdm 4.70 tqdm/std.py `display`)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return True
    return size.columns > 0 and size.lines > 0


@contextlib.contextmanager
def library_bars_off(off: bool = True) -> Iterator[None]:
    """Within it, transformers' and huggingface_hub's own bars are hidden (when `off`); their
    previous state is restored after (transformers 5.x utils/logging.py `disable_progress_bar`,
    huggingface_hub utils/tqdm.py `disable_progress_bars`)."""
    if not off:
        yield
        return
    try:
        import huggingface_hub.utils as hub_utils
        import transformers.utils.logging as hf_logging
    except ImportError:  # the analysis-only install has neither
        yield
        return
    transformers_on, hub_on = hf_logging.is_progress_bar_enabled(), not hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()
        if hub_on:
            hub_utils.enable_progress_bars()
