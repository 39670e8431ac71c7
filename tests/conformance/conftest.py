"""pytest wiring of the conformance lane: the ckptfs binary, and the results table.

Every test is labelled with the framework it runs (marker `framework`, MindSpore by default) and
the first line of its docstring; with --conformance-results FILE the session writes the results
table of this run's outcomes to FILE (scripts/conformance.sh: build/conformance-results.md, which
`scripts/conformance.sh --refresh-doc` copies into docs/CONFORMANCE.md).
"""

import os

import pytest

import msconf
import report as results_table

FRAMEWORKS = {"MindSpore": "mindspore", "MindFormers": "mindformers"}


def pytest_addoption(parser):
    parser.addoption("--ckptfs", default=os.environ.get(
        "CKPTFS_BINARY", os.path.join(msconf.REPO, "build", "ckptfs")),
        help="the ckptfs binary to mount with")
    parser.addoption("--conformance-results", default=None,
                     help="write the results table of this run to this file")


# This session's tests in collection order, their labels, frameworks and worst outcomes.
STATE = {"order": [], "label": {}, "framework": {}, "outcome": {}}


def pytest_configure(config):
    config.addinivalue_line("markers", "framework(name): the framework a test runs")


@pytest.fixture(autouse=True)
def injected_failure(request):
    """The test command's self-test (scripts/test-selftest.sh) sets CKPTFS_INJECT_FAILURE=1 to
    prove that a failing case fails the lane: the first case that runs then fails."""
    yield
    if os.environ.get("CKPTFS_INJECT_FAILURE") == "1" and not STATE.get("injected"):
        STATE["injected"] = request.node.nodeid
        pytest.fail("failure injected (CKPTFS_INJECT_FAILURE=1)")


@pytest.fixture(scope="session")
def ckptfs(request):
    path = request.config.getoption("--ckptfs")
    assert os.access(path, os.X_OK), f"{path}: no ckptfs binary (run scripts/conformance.sh)"
    return path


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("framework")
        STATE["order"].append(item.nodeid)
        STATE["label"][item.nodeid] = results_table.case_label(item)
        STATE["framework"][item.nodeid] = marker.args[0] if marker else "MindSpore"


def pytest_runtest_logreport(report):
    results_table.record_outcome(STATE["outcome"], report)


def pytest_sessionfinish(session, exitstatus):
    results_table.fail_if_skipped(session, STATE["outcome"])
    results = session.config.getoption("--conformance-results")
    if not results or not STATE["order"]:
        return
    rows = []
    for nodeid in STATE["order"]:
        framework = STATE["framework"][nodeid]
        rows.append((framework, results_table.version(FRAMEWORKS.get(framework, framework.lower())),
                     STATE["label"][nodeid], STATE["outcome"].get(nodeid, "not run")))
    results_table.write_results(results, rows)
