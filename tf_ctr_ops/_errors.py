"""One informative line from an exception, for reports and CLI errors."""

import os

_BOILERPLATE = ("Graph execution error", "Detected at node", "<stack traces", "[[", "Traceback", "File ")


def summary(e):
    """"Type: message", the message being its first line that is not TF's
    framing ("Graph execution error:", "Detected at node ...", node lists)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    informative = [line for line in lines if not line.startswith(_BOILERPLATE)]
    text = (informative or lines or [""])[0]
    return f"{type(e).__name__}: {text}"


def unwritable(path):
    """Why no file can be written at `path` (checked before a long run, not
    after it), or "" when one can."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        return f"{path} cannot be written (a folder, or its folder is missing or read-only)"
    return ""
