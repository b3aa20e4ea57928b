"""A job's `--help`, or a mistyped option, answers before TensorFlow is imported: at once, without its log noise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

JOBS = ("mnist", "custom_loop", "fashion_records", "model_parallel", "prepare_fashion_records", "reuters")
# Runs the job as `python jobs/JOB.py ARGS` does, then says whether tensorflow got imported on the way.
PROBE = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("tensorflow imported:", "tensorflow" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("job", JOBS)
def test_a_jobs_help_comes_before_tensorflow(job: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, f"jobs/{job}.py", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: {job}.py"), done.stderr
    assert done.stderr.strip() == "tensorflow imported: False", done.stderr


def test_a_mistyped_job_option_is_refused_before_tensorflow() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, "jobs/mnist.py", "--epocs", "3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "unrecognized arguments: --epocs 3" in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith("tensorflow imported: False"), done.stderr


@pytest.mark.parametrize("option", ["--batch-size", "--steps-per-epoch", "--backup-every-steps", "--steps-per-execution",
                                    "--virtual-devices"])
def test_a_count_of_zero_is_refused_as_the_options_are_parsed(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--batch-size 0` was a ZeroDivisionError traceback after TensorFlow's start-up; `--steps-per-epoch 0`
    silently meant the whole set."""
    from launcher.jobkit import job_arguments

    parser = job_arguments("a job", batch_size=32)
    for bad, why in (("0", "0: give 1 or more"), ("-2", "-2: give 1 or more"), ("x", "'x' is not a whole number")):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([option, bad])
        assert exited.value.code == 2 and f"argument {option}: {why}" in capsys.readouterr().err
    assert getattr(parser.parse_args([option, "3"]), option[2:].replace("-", "_")) == 3


def test_a_zero_batch_is_refused_before_tensorflow() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, "jobs/mnist.py", "--batch-size", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "argument --batch-size: 0: give 1 or more" in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith("tensorflow imported: False"), done.stderr
