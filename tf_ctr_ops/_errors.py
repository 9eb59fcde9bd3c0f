"""One informative line from an exception, for reports and CLI errors."""

_BOILERPLATE = ("Graph execution error", "Detected at node", "<stack traces", "[[", "Traceback", "File ")


def summary(e):
    """"Type: message", the message being its first line that is not TF's
    framing ("Graph execution error:", "Detected at node ...", node lists)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    informative = [line for line in lines if not line.startswith(_BOILERPLATE)]
    text = (informative or lines or [""])[0]
    return f"{type(e).__name__}: {text}"
