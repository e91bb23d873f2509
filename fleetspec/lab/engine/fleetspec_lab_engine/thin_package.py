"""`sglang` as a thin lab host's engine process sees it (hook.py): empty, so starting costs nothing."""

__version__ = "thin"
