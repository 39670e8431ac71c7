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


def case_label(item):
    """A case's row label: the first line of its test's docstring, and its parameters' id."""
    doc = (item.function.__doc__ or item.name).strip().splitlines()[0].strip()
    callspec = getattr(item, "callspec", None)
    return f"{doc}: {callspec.id}" if callspec else doc


SEVERITY = {"failed": 4, "skipped": 3, "known divergence (xfail)": 2, "passed": 1}


def record_outcome(outcomes, test_report):
    """Keeps each case's worst outcome in `outcomes` (pytest_runtest_logreport): a failed setup or
    teardown fails the case too; "passed" counts only from the call. A strict xfail is a known
    divergence, listed in docs/CONFORMANCE.md; it is no skip."""
    outcome = test_report.outcome
    if hasattr(test_report, "wasxfail") and outcome == "skipped":
        outcome = "known divergence (xfail)"
    if test_report.when == "call" or outcome != "passed":
        current = outcomes.get(test_report.nodeid)
        if current is None or SEVERITY[outcome] > SEVERITY[current]:
            outcomes[test_report.nodeid] = outcome


def fail_if_skipped(session, outcomes):
    """The lane is never skipped in part: a skipped case fails the run."""
    import pytest
    if "skipped" in outcomes.values() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
