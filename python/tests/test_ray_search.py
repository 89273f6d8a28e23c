"""The Ray policy search (examples/policy_search/ray_search.py) on a small
grid and a local Ray cluster: the same ranking as one process, a worker
killed mid-search loses no result, an interrupted search resumes."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")


@pytest.fixture(scope="module")
def search(root: Path):
    path = root / "examples" / "policy_search" / "ray_search.py"
    spec = importlib.util.spec_from_file_location("ray_search", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ray_search"] = mod
    spec.loader.exec_module(mod)
    return mod


ARGS = ["--candidates", "6", "--seeds", "1,2", "--horizon-s", "10", "--json"]


def ranking(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_ray_gives_the_ranking_of_one_process_and_survives_a_lost_worker(search, capsys, tmp_path):
    assert search.main(ARGS + ["--local"]) == 0
    local = ranking(capsys)
    chaos = tmp_path / "chaos"
    chaos.mkdir()
    ckpt = tmp_path / "results.jsonl"
    assert search.main(ARGS + ["--num-cpus", "2", "--checkpoint", str(ckpt),
                               "--chaos-dir", str(chaos)]) == 0
    distributed = ranking(capsys)
    # The third candidate's tasks each killed their worker once; Ray ran them again.
    assert len(list(chaos.iterdir())) == 2
    assert distributed["evaluated"] == 12
    assert distributed["ranking"] == local["ranking"]
    assert len(ckpt.read_text().splitlines()) == 12


def test_an_interrupted_search_resumes_from_its_checkpoint(search, capsys, tmp_path):
    ckpt = tmp_path / "results.jsonl"
    assert search.main(ARGS + ["--local", "--checkpoint", str(ckpt), "--stop-after", "5"]) == 0
    first = ranking(capsys)
    assert first["evaluated"] == 5
    assert search.main(ARGS + ["--num-cpus", "2", "--checkpoint", str(ckpt)]) == 0
    rest = ranking(capsys)
    assert rest["evaluated"] == 7
    assert search.main(ARGS + ["--local"]) == 0
    assert rest["ranking"] == ranking(capsys)["ranking"]
