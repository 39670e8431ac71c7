"""The results table of docs/CONFORMANCE.md, rewritten between its two marker lines.

Only the table and the environment line change; the text around them is hand-written. The output
holds no times or dates, so a run with the same outcomes leaves the file unchanged.
"""

import platform
from importlib import metadata

BEGIN = "<!-- conformance-results:begin (written by scripts/conformance.sh) -->"
END = "<!-- conformance-results:end -->"
ENVIRONMENT = ("mindspore", "safetensors", "numpy", "protobuf")


def version(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows):
    env = ", ".join(f"{p} {version(p)}" for p in ENVIRONMENT)
    lines = [BEGIN, "",
             f"Environment of the last full run: Python {platform.python_version()}, {env}.",
             "", "| framework | version | case | result |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(_cell(c) for c in row)} |" for row in rows]
    passed = sum(1 for row in rows if row[3] == "passed")
    lines += ["", f"{passed} of {len(rows)} cases passed.", "", END]
    return "\n".join(lines)


def write_table(path, rows):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path}: no results markers ({BEGIN} ... {END})")
    new = text[:start] + render(rows) + text[end + len(END):]
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
