"""The evolutionary searches' adapters (examples/policy_search): OpenEvolve
run end to end offline, its LLM blis-mockserver in scripted mode with canned
completions (valid programs, a syntax error, an endless loop, an
out-of-range instance), and the GEPA adapter's evaluate and reflection."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mockserver(root: Path) -> str:
    given = os.environ.get("BLIS_MOCKSERVER_BIN")
    for c in [given] + [str(root / "target" / p / "blis-mockserver") for p in ("release", "debug")]:
        if c and Path(c).is_file():
            return c
    pytest.fail("blis-mockserver is not built (cargo build --release) and BLIS_MOCKSERVER_BIN is not set")


def test_openevolve_evolves_a_routing_program_offline(root, mockserver, capsys, monkeypatch):
    pytest.importorskip("openevolve", reason="openevolve is not installed (pip install openevolve)")
    import json

    monkeypatch.setenv("BLIS_MOCKSERVER_BIN", mockserver)
    run = load(root / "examples" / "policy_search" / "openevolve" / "run_offline.py", "run_offline")
    assert run.main(["--iterations", "5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    canned = report["canned"]
    # Every failure kind is a zero score with its reason, not a crash.
    assert canned[1]["combined_score"] == 0 and "routing.source" in canned[1]["error"]
    assert "budget of 100000 operations" in canned[2]["error"]
    assert "returned instance 8, not in 0..8" in canned[4]["error"]
    assert canned[0]["error"] is None and canned[3]["error"] is None
    # The search kept the best valid program it was given.
    best_canned = max(c["combined_score"] for c in canned)
    assert report["best_score"] == pytest.approx(max(best_canned, report["initial_score"]))
    assert report["best_score"] > report["initial_score"]
    assert "fn route" in report["best_code"]


def test_gepa_evolves_a_routing_program_offline(root, mockserver, capsys, monkeypatch):
    pytest.importorskip("gepa", reason="gepa is not installed (pip install gepa)")
    import json

    monkeypatch.setenv("BLIS_MOCKSERVER_BIN", mockserver)
    run = load(root / "examples" / "policy_search" / "gepa_offline.py", "gepa_offline")
    assert run.main(["--metric-calls", "30", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # GEPA's loop ran through the canned failures (each scored 0 and
    # rejected) and accepted the valid programs that improved on the seed.
    assert report["candidates"] >= 2
    assert report["best_score"] > report["initial_score"] > 0
    assert "fn route" in report["best_code"]


def test_the_gepa_adapter_scores_and_explains_candidates(root):
    gepa_adapter = load(root / "examples" / "policy_search" / "gepa_adapter.py", "gepa_adapter")
    a = gepa_adapter.BlisRoutingAdapter(horizon_s=20)
    good = a.evaluate([1, 2], {"route": gepa_adapter.INITIAL_PROGRAM}, capture_traces=True)
    assert len(good.scores) == 2 and all(s > 0 for s in good.scores)
    bad = a.evaluate([1], {"route": "fn route(r, xs) { loop { } }"}, capture_traces=True)
    assert bad.scores == [0.0]
    data = a.make_reflective_dataset({"route": "..."}, bad, ["route"])
    assert "budget" in data["route"][0]["Feedback"]
    data = a.make_reflective_dataset({"route": "..."}, good, ["route"])
    assert "routing" in data["route"][0]["Feedback"]
