"""The results table of the conformance lane: a full run writes it to a file of its own
(build/conformance-results.md); `scripts/conformance.sh --refresh-doc` copies the last one into
docs/CONFORMANCE.md between its two marker lines, a deliberate step, so that running the tests
never changes a tracked file.

Only the table and the environment line change; the text around them is hand-written. The output
holds no times or dates, so a run with the same outcomes leaves the doc unchanged.

    python3 tests/conformance/report.py refresh RESULTS DOC
"""

import platform
import sys
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


def write_results(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(rows) + "\n")


def add_rows(path, rows):
    """Adds `rows` to the table a run of the other lane wrote to `path` (the environment line
    and the rows already there kept), or writes a table of these rows alone."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return write_results(path, rows)
    new = [f"| {' | '.join(_cell(c) for c in row)} |" for row in rows]
    last = max(i for i, line in enumerate(lines) if line.startswith("| "))
    lines[last + 1:last + 1] = new
    table = [line for line in lines if line.startswith("| ") and not line.startswith("| framework")]
    passed = sum(1 for line in table if line.rstrip().endswith("| passed |"))
    lines = [f"{passed} of {len(table)} cases passed." if line.endswith("cases passed.") else line
             for line in lines]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _block(path):
    """The text from the BEGIN marker to the END marker (inclusive) and where it is."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no results markers ({BEGIN} ... {END})")
    return text, start, end + len(END)


def refresh(results, doc):
    """Puts the results block of `results` into `doc` in place of the one there."""
    table, start, end = _block(results)
    text, doc_start, doc_end = _block(doc)
    new = text[:doc_start] + table[start:end] + text[doc_end:]
    if new != text:
        with open(doc, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{doc}: results table {'refreshed' if new != text else 'unchanged'} from {results}")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "refresh":
        raise SystemExit("usage: report.py refresh RESULTS DOC")
    refresh(sys.argv[2], sys.argv[3])
