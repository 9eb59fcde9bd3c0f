"""One informative line from an exception, for reports and CLI errors."""

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
    links) that `path` also names, or "": a hard link, or a path through a
    link to a folder of it (the file may not exist yet). Writing one writes
    the other, and realpath tells neither."""
    try:
        st = os.stat(path)
    except OSError:
        st = None  # not made yet: a folder `place` links to may still be where it would go
    if st is not None and not stat.S_ISREG(st.st_mode):
        return ""
    if st is None or st.st_nlink < 2:  # no hard link: only a folder `place` links to can hold it
        return _through_folder_links(path, place)
    for candidate in _files_in(place):
        try:
            other = os.stat(candidate)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return candidate
    return ""


def _through_folder_links(path, place):
    """`path` as named through a link to a folder in `place`'s own tree
    (links not followed: a SavedModel's few files are walked, not what they
    link to), or ""."""
    if not os.path.isdir(place):
        return ""
    real = os.path.realpath(path)
    for root, folders, _ in os.walk(place):
        for name in folders:
            link = os.path.join(root, name)
            if os.path.islink(link) and inside(real, link):
                return os.path.join(link, os.path.relpath(real, os.path.realpath(link)))
    return ""


def _files_in(place):
    """`place` if it is not a folder, else every file below it, links to
    folders followed (each folder once: links may loop)."""
    if not os.path.isdir(place):
        yield place
        return
    seen, folders = set(), [place]
    while folders:
        folder = folders.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                is_folder = entry.is_dir()
            except OSError:
                continue
            if is_folder:
                folders.append(entry.path)
            else:
                yield entry.path


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
