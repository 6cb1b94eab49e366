"""Progress bars of the long tuning-database commands (tune, train, report, db refresh-features).

One look for all of them: tqdm on stderr, redrawn often on a terminal and a line every 15 s in
a log; ``enabled=False`` (the commands' ``--no-progress``) draws nothing. :class:`Stages` is a bar
over a few named steps whose elapsed time keeps moving on a terminal while one step (a model fit)
runs for seconds without reporting.
"""
from __future__ import annotations

import sys
import threading

from tqdm.auto import tqdm

#: Seconds between redraws of a bar on a terminal and in a log.
TTY_INTERVAL_S, LOG_INTERVAL_S = 0.1, 15.0


def bar(total=None, desc: str = "", unit: str = "it", enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr (close it, or use it as a context manager)."""
    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=tty,
                mininterval=TTY_INTERVAL_S if tty else LOG_INTERVAL_S)


class Stages:
    """A bar over ``total`` steps: ``with Stages(n, "matplan train") as s: s.step("fit"); ...``.

    :meth:`step` completes the step before (if any) and names the one starting; on a terminal a
    thread redraws the bar each second so that the elapsed time shows a long step is alive.
    """

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.bar = bar(total, desc, "step", enabled)
        self._started = False
        self._stop = threading.Event()
        self._ticker = None
        if enabled and sys.stderr.isatty():
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def _tick(self):
        while not self._stop.wait(1.0):
            self.bar.refresh()

    def step(self, name: str) -> None:
        if self._started:
            self.bar.update(1)
        self._started = True
        self.bar.set_postfix_str(name, refresh=True)

    def write(self, text: str) -> None:
        """Print a line without breaking the bar."""
        self.bar.write(text)

    def close(self, completed: bool = True) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._started and completed:
            self.bar.update(1)
            self.bar.set_postfix_str("done", refresh=False)
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(completed=exc_type is None)


__all__ = ["bar", "Stages"]
