"""One informative line from an exception, for reports and CLI errors."""

import collections
import os
import re
import stat

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


def inside(path, folder):
    """Whether path is folder or lies inside it (links and `..` resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def same_file_in(path, place):
    """The file in `place` (a file, or a folder searched whole, through its
    links) that `path` names too, or would name once made, or "": through a
    hard link, a link to the file, or a link to a folder of it. Writing one
    writes the other, and realpath tells none of these."""
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        st = None  # not made yet: where it would go still counts
    if st is not None and not stat.S_ISREG(st.st_mode):
        return ""

    def same(candidate):
        if os.path.realpath(candidate) == real:
            return True
        if st is None or st.st_nlink < 2:
            return False
        try:
            other = os.stat(candidate)
        except OSError:
            return False
        return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)

    if not os.path.isdir(place):
        return place if same(place) else ""
    for folder, files in _folders_in(place):
        if os.path.realpath(folder) == os.path.dirname(real):
            return os.path.join(folder, os.path.basename(real))
        for file in files:
            if same(file):
                return file
    return ""


_MOST_FOLDERS = 20_000


def _folders_in(place):
    """(folder, its files) for `place` and every folder below it, links to
    folders followed (each folder once: links may loop): its own tree
    first, then what links lead to, the first _MOST_FOLDERS only (a link to
    / would walk the whole machine)."""
    seen, own, linked = set(), collections.deque([place]), collections.deque()
    while (own or linked) and len(seen) < _MOST_FOLDERS:
        folder, through_link = (own.popleft(), False) if own else (linked.popleft(), True)
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(folder))
        except OSError:
            continue
        files = []
        for entry in entries:
            try:
                if not entry.is_dir():
                    files.append(entry.path)
                elif through_link or entry.is_symlink():
                    linked.append(entry.path)
                else:
                    own.append(entry.path)
            except OSError:
                continue
        yield folder, files


def unwritable(path):
    """Why no file can be written at `path` (checked before a long run, not
    after it), or "" when one can. A file is opened to append, as only that
    tells (a link to a missing folder, /proc, a socket), and removed if that
    made it; a pipe or a terminal is only checked for permission, as opening
    one may block or end its reader's input."""
    if os.path.isdir(path):
        return f"{path} cannot be written: it is a folder"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None  # nothing there yet (or a link to nothing)
    if mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        return "" if os.access(path, os.W_OK) else f"{path} cannot be written: permission denied"
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return f"{path} cannot be written: {e.strerror or e}"
    if mode is None:
        os.remove(os.path.realpath(path))  # what the open made, not a link to it
    return ""
