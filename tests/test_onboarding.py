"""The first hour: `make demo` on a fresh clone, `plangate demo` and `plangate init` from an installed package.

These tests install for real (a virtual environment, pip), so each takes tens of seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from click.testing import CliRunner

from plangate.cli import main
from tests.conftest import ROOT

FAIL_LOUDLY = '#!/bin/sh\necho "$0 must not run: make demo needs only Python" >&2\nexit 97\n'


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points at this checkout's code or venv, or at an outer make
    (run under `make test`, a nested make would print its directory and take the outer one's flags)."""
    outside = ("PYTHONPATH", "VIRTUAL_ENV", "PLANGATE_DB", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")
    env = {k: v for k, v in os.environ.items() if k not in outside}
    return {**env, **extra}


def test_make_demo_on_a_fresh_clone_needs_only_python(tmp_path: Path) -> None:
    """A clone of this repository's committed state, with apt-get and sudo that fail if called."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    for name in ("apt-get", "sudo"):
        (fake / name).write_text(FAIL_LOUDLY)
        (fake / name).chmod(0o755)
    python = shutil.which("python3.11") or sys.executable
    env = clean_env(PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["make", "demo", f"PYTHON={python}"], cwd=clone, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "must not run" not in done.stderr
    assert done.stdout.rstrip().endswith("{'refund': 2, 'email': 2}")
    installed = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    for package in ("playwright", "llama_cpp", "llama-cpp", "temporalio"):
        assert package not in installed, f"make demo installed {package}"


def test_init_writes_a_starter_project_that_checks_as_written(tmp_path: Path) -> None:
    project = tmp_path / "project"
    code, out, _ = run("init", str(project))
    assert code == 0 and "wrote a starter project" in out
    for plan in ("lookup", "close"):
        code, out, _ = run(
            "check",
            str(project / "plans" / f"{plan}.json"),
            *("--tools", str(project / "tools.py"), "--policy", str(project / "policy.yaml"), "--as", "alice"),
        )
        assert code == 0 and out.startswith("ok: plan "), out
    assert "plangate submit plans/close.json" in (project / "README.md").read_text()


def test_init_refuses_a_folder_that_is_not_empty_without_force(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    code, _, err = run("init", str(tmp_path))
    assert (
        code == 2
        and err == f"plangate: {tmp_path} is not empty: choose another folder, or add --force to write into it\n"
    )
    assert not (tmp_path / "tools.py").exists()
    code, _, _ = run("init", str(tmp_path), "--force")
    assert code == 0 and (tmp_path / "tools.py").is_file() and (tmp_path / "mine.txt").read_text() == "keep me"


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject.toml lists the packages by hand (examples/ and docs/ are mapped into two): none is forgotten."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(path.parent.relative_to(ROOT / "src").parts)
        for path in (ROOT / "src" / "plangate").rglob("__init__.py")
    }
    assert listed == found | {"plangate._examples", "plangate._docs"}


def test_pip_install_then_demo_and_init_work_from_that_venv(tmp_path: Path) -> None:
    """The package as a user gets it: built and installed (not editable) into a fresh venv.

    To stay quick and need the network only for the build backend (which pip caches), the
    install skips dependencies (--no-deps), and a .pth file puts this venv's site-packages
    after the new venv's own: pydantic and the rest resolve from there, while plangate
    itself, with its package data, comes from the wheel just built.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    plangate = str(bin_dir / "plangate")
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = clean_env()
    subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            str(ROOT),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    done = subprocess.run(
        [plangate, "demo", "--dir", "D"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"--tools {site.relative_to(tmp_path)}/plangate/_examples/business.py" in done.stdout, (
        "the example comes from the package"
    )
    assert done.stdout.rstrip().endswith("{'refund': 2, 'email': 2}")
    subprocess.run([plangate, "init", "D2"], cwd=tmp_path, env=env, check=True, capture_output=True)
    for plan in ("lookup", "close"):
        checked = subprocess.run(
            [
                plangate,
                "check",
                f"D2/plans/{plan}.json",
                *("--tools", "D2/tools.py"),
                "--policy",
                "D2/policy.yaml",
                "--as",
                "alice",
            ],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0 and checked.stdout.startswith("ok: plan "), checked.stdout + checked.stderr


def test_demo_serve_leaves_the_dashboard_up_with_the_demos_plans(tmp_path: Path) -> None:
    """`make demo SERVE=1` is `plangate demo --serve`: the story, then a dashboard a reviewer can log into."""
    import http.cookiejar
    import signal
    import urllib.parse
    import urllib.request

    from plangate.testing import free_port
    from tests.helpers import wait_until_up

    port = free_port()
    log = tmp_path / "demo.log"
    plangate = str(Path(sys.executable).parent / "plangate")
    with log.open("w") as out:
        process = subprocess.Popen(
            [plangate, "demo", "--dir", "D", "--serve", "--port", str(port)],
            cwd=tmp_path,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/login", process, log, seconds=90)
        assert f"log in at {url} as dave, carol, alice, gina or audrey, password demo-password" in log.read_text()
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        browser.open(f"{url}/login").read()
        csrf = next(cookie.value for cookie in jar if cookie.name == "plangate_login_csrf")
        form = urllib.parse.urlencode({"name": "dave", "password": "demo-password", "csrf": csrf}).encode()
        queue = browser.open(f"{url}/login", data=form).read().decode()  # the redirect lands on the queue
        waiting = re.search(r"alice's second refund plan (\w{8}) waits in the queue", log.read_text())
        assert waiting and waiting[1] in queue and "Refund invoice 42" in queue, queue[-2000:]
        every = browser.open(f"{url}/plans").read().decode()
        assert every.count("Refund invoice 42") >= 2 and "status-succeeded" in every, every[-2000:]  # dave sees refunds
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
