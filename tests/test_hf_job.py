"""The HF Jobs benchmark matrix, offline: the submission a dry run prints, the job's own pieces
(toolkit discovery, checkout), the pull, the justfile verbs and the rendered matrix. Nothing here
reaches the Hub."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))

import hf_job  # noqa: E402
import render  # noqa: E402

URL, SHA, RESULTS = "https://github.com/example/maxsim.git", "0123abcd" * 5, "someone/bench"


def test_dry_run_prints_the_exact_submission(capsys):
    assert hf_job.main(["submit", "--flavor", "h100", "--dry-run", "--repo", URL, "--revision",
                        SHA, "--results-repo", RESULTS, "--bench-args", "--only rerank"]) == 0
    cli, rest = capsys.readouterr().out.split("\n", 1)
    assert cli == (
        "hf jobs uv run --flavor h100 --timeout 2h --secrets HF_TOKEN scripts/hf_job.py run "
        f"--repo {URL} --revision {SHA} --results-repo {RESULTS} --bench-args '--only rerank'"
    )
    kwargs = json.loads(rest)["run_uv_job"]
    assert kwargs["script"] == "scripts/hf_job.py" and kwargs["flavor"] == "h100"
    assert kwargs["script_args"] == shlex.split(cli)[11:]  # the API call runs the same job
    assert kwargs["secrets"] == {"HF_TOKEN": "<your token>"}  # never a real token


def test_the_job_arguments_parse_back():
    _, kwargs = hf_job.submission("h200", URL, SHA, RESULTS, "--dtype bf16")
    args = hf_job.parse_args(kwargs["script_args"])
    assert (args.verb, args.repo, args.revision, args.results_repo, args.bench_args) == (
        "run", URL, SHA, RESULTS, "--dtype bf16")


def test_the_script_header_is_pep_723():
    text = (REPO / "scripts" / "hf_job.py").read_text()
    block = text.split("# /// script\n", 1)[1].split("# ///\n", 1)[0]
    toml = "".join(line[2:] + "\n" for line in block.splitlines())
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads(toml)["dependencies"]
    assert any(d.startswith("torch") for d in deps)
    assert any(d.startswith("huggingface_hub") for d in deps)
    assert any(d.startswith("nvidia-cuda-nvcc") for d in deps)  # builds without a system toolkit


def test_pull_dry_run(capsys, tmp_path):
    assert hf_job.main(["pull", "--dry-run", "--results-repo", RESULTS, "--dest",
                        str(tmp_path)]) == 0
    call = json.loads(capsys.readouterr().out)["snapshot_download"]
    assert call == {"repo_id": RESULTS, "repo_type": "dataset",
                    "allow_patterns": ["bench_results/*.json"], "local_dir": str(tmp_path)}


def test_the_wheels_toolkit_becomes_cuda_home(tmp_path):
    home = tmp_path / "site" / "nvidia" / "cu13"
    (home / "bin").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "bin" / "nvcc").write_text("")
    (home / "lib" / "libcudart.so.13").write_text("")
    env = hf_job.toolkit_env({"PATH": str(tmp_path / "empty")}, [str(tmp_path / "other"),
                                                                  str(tmp_path / "site")])
    assert env["CUDA_HOME"] == str(home)
    assert env["PATH"].split(os.pathsep)[0] == str(home / "bin")
    assert os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13"
    again = hf_job.toolkit_env({"PATH": str(tmp_path / "empty")}, [str(tmp_path / "site")])
    assert again == env  # the link is made once


def test_a_machine_toolkit_is_kept(tmp_path):
    (tmp_path / "nvcc").write_text("")
    env = {"PATH": str(tmp_path)}
    assert hf_job.toolkit_env(env, [str(tmp_path)]) == env
    assert hf_job.toolkit_env({"CUDA_HOME": "/opt/cuda"}, []) == {"CUDA_HOME": "/opt/cuda"}


def test_checkout_fetches_the_revision(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=src, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (src / "file.txt").write_text("first")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True,
                           text=True).stdout.strip()
    (src / "file.txt").write_text("second")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "second")
    run("config", "uploadpack.allowAnySHA1InWant", "true")
    assert hf_job.checkout(str(src), first, tmp_path / "dest") == first
    assert (tmp_path / "dest" / "file.txt").read_text() == "first"


def test_justfile_has_the_verbs():
    text = (REPO / "justfile").read_text()
    assert "bench-matrix flavor *args:" in text and "hf_job.py submit --flavor {{flavor}}" in text
    assert "bench-pull *args:" in text and "hf_job.py pull" in text


def _doc(gpu, ours, peer):
    row = lambda impl, ms: {"workload": "rerank", "dtype": "fp16", "impl": impl,  # noqa: E731
                            "status": "ok", "ms_p50": ms, "commit": "0123abc",
                            "dirty": False, "gpu": gpu, "date": "2026-11-26"}
    return {"schema": 2, "gpu": gpu, "workloads": {"rerank": {"sweep": False}},
            "rows": [row("maxsim", ours), row("naive", 1.0), row("flash-maxsim", peer),
                     {**row("late-interaction-kernels", None), "status": "oom"}]}


def test_matrix_has_a_column_per_gpu_and_the_speedup_over_the_best_peer():
    lines = render.matrix_table([("h100", _doc("H100", 0.05, 0.1)),
                                 ("h200", _doc("H200", 0.04, 0.02))])
    assert lines[0] == "| workload | dtype | H100 | H200 |"
    assert lines[2] == ("| rerank | fp16 | 0.0500 · 2.00× flash-maxsim "
                        "| 0.0400 · 0.50× flash-maxsim |")
    section, _, _ = render.render([("h100", _doc("H100", 0.05, 0.1)),
                                   ("h200", _doc("H200", 0.04, 0.02))], REPO / "docs", REPO,
                                  REPO / "docs" / "BENCHMARKS.md")
    assert "### Across GPUs" in section and lines[2] in section


def test_an_image_goes_into_both_forms():
    cli, kwargs = hf_job.submission("h100", URL, SHA, RESULTS, image="ghcr.io/x/uv:py3.12")
    assert "--image ghcr.io/x/uv:py3.12 --secrets HF_TOKEN" in cli
    assert kwargs["image"] == "ghcr.io/x/uv:py3.12"


@pytest.mark.parametrize("url", [URL, "https://github.com/example/maxsim",
                                 "git@github.com:example/maxsim.git"])
def test_archive_url_of_a_github_commit(url):
    assert hf_job.archive_url(url, SHA) == (
        f"https://codeload.github.com/example/maxsim/tar.gz/{SHA}")


@pytest.mark.parametrize("url,revision", [(URL, "main"), ("https://gitlab.com/a/b.git", SHA)])
def test_archive_url_refuses_what_it_cannot_name(url, revision):
    with pytest.raises(SystemExit):
        hf_job.archive_url(url, revision)


def test_without_git_the_archive_is_unpacked(tmp_path, monkeypatch):
    import io
    import tarfile
    import urllib.request

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = b"print('bench')\n"
        info = tarfile.TarInfo(f"maxsim-{SHA}/benchmarks/bench.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    data.seek(0)
    opened = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda url: opened.append(url) or data)
    monkeypatch.setattr(hf_job.shutil, "which", lambda name: None)
    assert hf_job.checkout(URL, SHA, tmp_path / "dest") == SHA
    assert opened == [hf_job.archive_url(URL, SHA)]
    assert (tmp_path / "dest" / "benchmarks" / "bench.py").read_bytes() == body


def test_the_job_runs_end_to_end_without_the_hub(tmp_path):
    """The job's steps on this commit, on the CPU: checkout, the benchmark (smoke), the copy."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    env = {**os.environ, "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""}  # the CPU job, on any machine
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "hf_job.py"), "run", "--repo", str(REPO),
         "--revision", head, "--results-repo", RESULTS, "--no-upload", "--workdir",
         str(tmp_path / "work"), "--copy-to", str(tmp_path / "out"), "--bench-args",
         "--smoke --only rerank --dtype fp16 --min-reps 5"],
        check=True, env=env, timeout=600,
    )
    doc = json.loads((tmp_path / "out" / "cpu.json").read_text())
    assert doc["commit"] == head and doc["dirty"] is False
    assert {r["workload"] for r in doc["rows"]} == {"rerank"}
