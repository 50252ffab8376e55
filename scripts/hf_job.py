# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.14.1",
#     "numpy",
#     "ninja",
#     "huggingface_hub>=0.34",
#     "nvidia-cuda-nvcc==13.0.*",
#     "nvidia-nvvm==13.0.*",
#     "nvidia-cuda-crt==13.0.*",
#     "nvidia-cuda-cccl==13.0.*",
#     "flash-maxsim==0.3.0",
#     "late-interaction-kernels==0.4.5",
# ]
# ///
"""The benchmark matrix on Hugging Face Jobs: one job per GPU flavor runs benchmarks/bench.py on a
given revision and uploads bench_results/<gpu>.json to a dataset repository on the Hub.

    python scripts/hf_job.py submit --flavor h100 [--dry-run]   # just bench-matrix h100
    python scripts/hf_job.py pull [--dry-run]                   # just bench-pull
    uv run scripts/hf_job.py run --repo URL --revision SHA --results-repo OWNER/NAME  # the job
    python scripts/hf_job.py run --repo . --revision HEAD --results-repo - --no-upload  # offline

The job is this file, run by ``uv`` from its inline header (torch, the CUDA compiler from the
NVIDIA wheels and the peers the benchmark compares with, so any image with uv will do): it fetches
the revision (git, or GitHub's archive where the image has no git), builds the extension as maxsim
does on import, runs the benchmark and uploads the result. ``submit`` and ``pull`` need
only ``huggingface_hub`` (and nothing at all with ``--dry-run``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
RESULTS_REPO = "maxsim/bench-results"  # a dataset repository; MAXSIM_RESULTS_REPO overrides it
TIMEOUT = "2h"


# ----------------------------------------------------------------------------------------------
# Submitting (on a developer's machine)
# ----------------------------------------------------------------------------------------------


def git(*args, cwd=REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def job_args(repo_url, revision, results_repo, bench_args) -> list[str]:
    """What the job runs this script with."""
    args = ["run", "--repo", repo_url, "--revision", revision, "--results-repo", results_repo]
    return args + (["--bench-args", bench_args] if bench_args else [])


def submission(flavor, repo_url, revision, results_repo, bench_args="", timeout=TIMEOUT,
               image=None):
    """``(command line, run_uv_job keyword arguments)`` of one job; the token is left out (the CLI
    reads it from the login, the API call gets it from :func:`huggingface_hub.get_token`).
    ``image``: a Docker image with uv (default: the Jobs' own uv image)."""
    script_args = job_args(repo_url, revision, results_repo, bench_args)
    kwargs = {"script": str(SCRIPT.relative_to(REPO)), "script_args": script_args,
              "flavor": flavor, "timeout": timeout, "secrets": {"HF_TOKEN": "<your token>"}}
    cli = ["hf", "jobs", "uv", "run", "--flavor", flavor, "--timeout", timeout]
    if image:
        kwargs["image"] = image
        cli += ["--image", image]
    cli += ["--secrets", "HF_TOKEN", kwargs["script"], *script_args]
    return shlex.join(cli), kwargs


def submit(args) -> int:
    revision = args.revision or git("rev-parse", "HEAD")
    try:
        repo_url = args.repo or git("remote", "get-url", "origin")
    except subprocess.CalledProcessError:
        sys.exit("this checkout has no `origin` remote: pass --repo URL (one the job can clone)")
    cli, kwargs = submission(args.flavor, repo_url, revision, args.results_repo, args.bench_args,
                             args.timeout, args.image)
    print(cli)
    print(json.dumps({"run_uv_job": kwargs}, indent=1))
    if args.dry_run:
        return 0
    if git("status", "--porcelain", "--", ".", ":(exclude)bench_results"):
        print("note: the working tree has changes; the job runs the committed revision "
              f"{revision[:12]}, which must be pushed to {repo_url}", file=sys.stderr)
    from huggingface_hub import HfApi, get_token

    token = get_token()
    if not token:
        sys.exit("no Hugging Face token: run `hf auth login` first")
    kwargs["script"] = str(SCRIPT)
    kwargs["secrets"] = {"HF_TOKEN": token}
    job = HfApi(token=token).run_uv_job(**kwargs)
    print(f"submitted job {job.id}: {getattr(job, 'url', '')}")
    return 0


def pull(args) -> int:
    """Every GPU's result file of the results repository into bench_results/."""
    call = {"repo_id": args.results_repo, "repo_type": "dataset",
            "allow_patterns": ["bench_results/*.json"], "local_dir": str(args.dest)}
    print(json.dumps({"snapshot_download": call}, indent=1))
    if args.dry_run:
        return 0
    from huggingface_hub import snapshot_download

    snapshot_download(**call)
    for path in sorted((Path(args.dest) / "bench_results").glob("*.json")):
        print(f"pulled {path}")
    return 0


# ----------------------------------------------------------------------------------------------
# The job (on the GPU machine)
# ----------------------------------------------------------------------------------------------


def pip_toolkit(site_dirs) -> Path | None:
    """The CUDA toolkit the NVIDIA wheels put in ``site-packages/nvidia/cu13`` (nvcc, headers,
    libraries in one folder), made usable as CUDA_HOME: the linker wants ``libcudart.so``, which
    the wheels ship only versioned. None when the wheels are not installed."""
    for site in site_dirs:
        home = Path(site) / "nvidia" / "cu13"
        if (home / "bin" / "nvcc").exists():
            cudart = home / "lib" / "libcudart.so"
            if not cudart.exists():
                cudart.symlink_to(next(p.name for p in (home / "lib").glob("libcudart.so.*")))
            return home
    return None


def toolkit_env(environ, site_dirs) -> dict:
    """``environ`` with CUDA_HOME and PATH pointing at a CUDA compiler: the machine's own where it
    has one, else the wheels' (:func:`pip_toolkit`)."""
    env = dict(environ)
    has_nvcc = any((Path(p) / "nvcc").exists() for p in env.get("PATH", "").split(os.pathsep) if p)
    if env.get("CUDA_HOME") or has_nvcc:
        return env
    home = pip_toolkit(site_dirs)
    if home is not None:
        env["CUDA_HOME"] = str(home)
        env["PATH"] = f"{home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def checkout(repo_url, revision, dest: Path) -> str:
    """The repository at ``revision`` in ``dest``; returns the full commit. With git, one commit
    fetched; without it (a slim image), GitHub's archive of a full commit hash."""
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("git") is None:
        return github_archive(repo_url, revision, dest)
    git("init", "-q", cwd=dest)
    git("fetch", "-q", "--depth", "1", repo_url, revision, cwd=dest)
    git("checkout", "-q", "FETCH_HEAD", cwd=dest)
    return git("rev-parse", "HEAD", cwd=dest)


def archive_url(repo_url, revision) -> str:
    """GitHub's tarball of ``revision`` (a full commit hash, so that the result names it)."""
    match = re.fullmatch(r"(?:https://|git@)github\.com[/:]([^/]+)/([^/]+?)(?:\.git)?/?", repo_url)
    if not match or not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise SystemExit(f"without git the job fetches GitHub archives of full commit hashes "
                         f"only, got {repo_url} at {revision}")
    return f"https://codeload.github.com/{match[1]}/{match[2]}/tar.gz/{revision}"


def github_archive(repo_url, revision, dest: Path) -> str:
    import tarfile
    import urllib.request

    with urllib.request.urlopen(archive_url(repo_url, revision)) as response:
        with tarfile.open(fileobj=response, mode="r|gz") as tar:
            for member in tar:  # drop the archive's top folder
                member.name = member.name.partition("/")[2]
                if member.name:
                    tar.extract(member, dest, filter="data")
    return revision


def run(args) -> int:
    import site

    import torch

    work = Path(args.workdir or tempfile.mkdtemp(prefix="maxsim-"))
    commit = checkout(args.repo, args.revision, work)
    os.environ.update(toolkit_env(os.environ, site.getsitepackages()))
    os.environ.update(PYTHONPATH=str(work / "torch-ext"), MAXSIM_COMMIT=commit, MAXSIM_DIRTY="0",
                      PYTHONUNBUFFERED="1")
    sys.path.insert(0, str(work / "benchmarks"))
    from bench import gpu_slug  # the clone's, so the file name is the one bench.py writes

    slug = gpu_slug(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"
    out = work / "bench_results" / f"{slug}.json"
    cmd = [sys.executable, "benchmarks/bench.py", "--out", str(out), *shlex.split(args.bench_args)]
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, cwd=work, check=True)
    if args.copy_to:
        Path(args.copy_to).mkdir(parents=True, exist_ok=True)
        shutil.copy(out, Path(args.copy_to) / out.name)
    if args.no_upload:
        print(f"wrote {out} (not uploaded)")
        return 0
    upload(out, args.results_repo, commit)
    return 0


def upload(path: Path, results_repo, commit):
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(results_repo, repo_type="dataset", exist_ok=True)
    api.upload_file(path_or_fileobj=str(path), path_in_repo=f"bench_results/{path.name}",
                    repo_id=results_repo, repo_type="dataset",
                    commit_message=f"bench_results/{path.name} at {commit[:12]}")
    print(f"uploaded bench_results/{path.name} to {results_repo}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    results = os.environ.get("MAXSIM_RESULTS_REPO", RESULTS_REPO)
    s = sub.add_parser("submit", help="submit the benchmark on one GPU flavor")
    s.add_argument("--flavor", required=True, help="HF Jobs hardware, e.g. h100, a100-large")
    s.add_argument("--repo", help="git URL the job clones (default: this checkout's origin)")
    s.add_argument("--revision", help="commit to benchmark (default: HEAD)")
    s.add_argument("--results-repo", default=results, help="dataset repository for the results")
    s.add_argument("--bench-args", default="", help="arguments for benchmarks/bench.py")
    s.add_argument("--timeout", default=TIMEOUT)
    s.add_argument("--image", help="a Docker image with uv (default: the Jobs' uv image)")
    s.add_argument("--dry-run", action="store_true", help="print the submission, send nothing")
    p = sub.add_parser("pull", help="download every GPU's results into bench_results/")
    p.add_argument("--results-repo", default=results)
    p.add_argument("--dest", type=Path, default=REPO)
    p.add_argument("--dry-run", action="store_true")
    r = sub.add_parser("run", help="what the job runs: clone, build, benchmark, upload")
    r.add_argument("--repo", required=True)
    r.add_argument("--revision", required=True)
    r.add_argument("--results-repo", required=True)
    r.add_argument("--bench-args", default="")
    r.add_argument("--workdir", help="where to clone (default: a new temporary folder)")
    r.add_argument("--copy-to", help="also copy the result file into this folder")
    r.add_argument("--no-upload", action="store_true",
                   help="leave the Hub out (a GPU machine without network: the job's other steps)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return {"submit": submit, "pull": pull, "run": run}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
