"""pytest wiring of the PyTorch conformance lane (scripts/conformance.sh runs it with
build/torch-venv): the ckptfs binary, the failure the test command's self-test injects, a
skipped case failing the run, and this lane's rows added to the results table the MindSpore
lane wrote (--conformance-results)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(REPO, "tests", "conformance"))

import report as results_table  # noqa: E402

STATE = {"order": [], "label": {}, "outcome": {}}


def pytest_addoption(parser):
    parser.addoption("--ckptfs", default=os.path.join(REPO, "build", "ckptfs"),
                     help="the ckptfs binary to mount with")
    parser.addoption("--conformance-results", default=None,
                     help="add this run's rows to the results table in this file")


@pytest.fixture(scope="session")
def ckptfs(request):
    path = request.config.getoption("--ckptfs")
    assert os.access(path, os.X_OK), f"{path}: no ckptfs binary (run scripts/conformance.sh)"
    return path


def dcp_fixture(*args):
    """Runs scripts/dcp_fixture.py with `args` (torch writing or loading checkpoints). Its
    workers leave without gloo's teardown, which now and then hung; should one hang anyway, the
    script runs under a timeout (the saves take about 30 s here), once more if it must."""
    for attempt in (1, 2):
        try:
            subprocess.run([sys.executable, os.path.join(REPO, "scripts", "dcp_fixture.py"),
                            *args], check=True, timeout=240)
            return
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise


@pytest.fixture(scope="session")
def torch_script():
    """scripts/dcp_fixture.py, as a function of its arguments (dcp_fixture above)."""
    return dcp_fixture


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """Every case saved by torch now (scripts/dcp_fixture.py)."""
    out = str(tmp_path_factory.mktemp("dcp"))
    dcp_fixture(out)
    return out


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """The MLP saved by FSDP2 and by tensor parallelism (scripts/dcp_fixture.py --models)."""
    out = str(tmp_path_factory.mktemp("dcp_models"))
    dcp_fixture("--models", out)
    return out


@pytest.fixture(autouse=True)
def injected_failure(request):
    """CKPTFS_INJECT_FAILURE=1 (scripts/test-selftest.sh) fails the first case that runs."""
    yield
    if os.environ.get("CKPTFS_INJECT_FAILURE") == "1" and not STATE.get("injected"):
        STATE["injected"] = request.node.nodeid
        pytest.fail("failure injected (CKPTFS_INJECT_FAILURE=1)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        STATE["order"].append(item.nodeid)
        STATE["label"][item.nodeid] = results_table.case_label(item)


def pytest_runtest_logreport(report):
    results_table.record_outcome(STATE["outcome"], report)


def pytest_sessionfinish(session, exitstatus):
    results_table.fail_if_skipped(session, STATE["outcome"])
    results = session.config.getoption("--conformance-results")
    if not results or not STATE["order"]:
        return
    version = results_table.version("torch")
    rows = [("PyTorch", version, STATE["label"][n], STATE["outcome"].get(n, "not run"))
            for n in STATE["order"]]
    results_table.add_rows(results, rows)
