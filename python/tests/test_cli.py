"""The package's ``stepstream`` command and ``python -m stepstream``: they run the Rust
binary in place of Python (its exit status and output are the binary's), and an install
without the binary says so instead of failing obscurely."""

import os
import subprocess
import sys
from pathlib import Path

import stepstream
from conftest import binary

BUNDLED = Path(stepstream.__file__).parent / "_bin" / "stepstream"


def run(args, **env):
    full = {k: v for k, v in os.environ.items() if k != "STEPSTREAM_BIN"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "stepstream", *args], env=full, capture_output=True, text=True
    )


def test_python_m_stepstream_runs_the_binary_with_its_exit_status():
    done = run(["--version"], STEPSTREAM_BIN=binary())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stepstream "), done.stdout
    bad = run(["serve", "--no-such-flag"], STEPSTREAM_BIN=binary())
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr, bad


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "stepstream"
    assert script.exists(), script
    done = subprocess.run(
        [str(script), "token", "--help"],
        env={**os.environ, "STEPSTREAM_BIN": binary()},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "token" in done.stdout, done


def test_an_install_without_the_binary_says_where_to_get_it():
    if BUNDLED.exists():
        # This wheel carries the binary (scripts/dist built it): it runs.
        done = run(["--version"])
        assert done.returncode == 0 and done.stdout.startswith("stepstream "), done
    else:
        done = run(["serve"])
        assert done.returncode == 1
        assert "has no hub binary" in done.stderr and "scripts/dist" in done.stderr, done.stderr
