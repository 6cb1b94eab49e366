"""Per-user folders (the tuning database lives in the cache folder, learned models in the data folder)."""
from __future__ import annotations

import os
from pathlib import Path

#: kind -> (Windows variable and fallback, XDG variable and fallback)
_BASES = {"cache": ("LOCALAPPDATA", ("AppData", "Local"), "XDG_CACHE_HOME", (".cache",)),
          "data": ("APPDATA", ("AppData", "Roaming"), "XDG_DATA_HOME", (".local", "share"))}


def user_folder(kind: str) -> Path:
    """matplan's folder of ``kind`` ('cache' or 'data') for this user, by the platform's conventions."""
    win, win_default, xdg, xdg_default = _BASES[kind]
    if os.name == "nt":
        base = Path(os.environ.get(win) or Path.home().joinpath(*win_default))
    else:
        base = Path(os.environ.get(xdg) or Path.home().joinpath(*xdg_default))
    return base / "matplan"
