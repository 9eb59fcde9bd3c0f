"""One informative line from an exception, for reports and CLI errors."""

import os
import re

_BOILERPLATE = ("Graph execution error", "Detected at node", "<stack traces", "[[", "Traceback", "File ")
# An eager op's framing around its message: "{{function_node __wrapped__X}} "
# before it, " [Op:X] name: " after it.
_EAGER_FRAMING = re.compile(r"^\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\]( name:\s*\S*)?\s*$")


def summary(e):
    """"Type: message", the message being its first line that is not TF's
    framing ("Graph execution error:", "Detected at node ...", node lists)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    informative = [line for line in lines if not line.startswith(_BOILERPLATE)]
    text = _EAGER_FRAMING.sub("", (informative or lines or [""])[0])
    return f"{type(e).__name__}: {text}"


def same_path(a, b):
    """Whether two paths name one file or folder (links and `..` resolved),
    whether or not it exists yet."""
    return os.path.realpath(a) == os.path.realpath(b)


def unwritable(path):
    """Why no file can be written at `path` (checked before a long run, not
    after it), or "" when one can."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        return f"{path} cannot be written (a folder, or its folder is missing or read-only)"
    return ""
