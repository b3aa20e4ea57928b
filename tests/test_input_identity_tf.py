"""A resume whose addressed input changed since the run began is refused in one line naming the field.

Example g of an addressed input is a pure function of (seed, data, g): relaunched into the model
dir of a stopped run with another `--seed`, another `--dataset` (as many examples, other ones) or
fewer examples, the kit used to say "resuming at global step 3: the input starts there (nothing
replayed)" and train the rest of the run on another stream, an exact resume in name only. The
first attempt now records the input's identity beside the run, and a resume compares with it.
A fresh start in the same model dir (no backup) records the new input instead: nothing is resumed.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from launcher import jobkit
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.input_identity import IDENTITY
from tests.jobkit_helpers import assert_none_alive, kill_all, start_job, wait_all, write_backup_at

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow

ROWS, BATCH = 32, 8  # 4 steps an epoch
RUNS = itertools.count()  # each call a run of its own, as a relaunch is (a run's done marker ends its training)


def arrays(seed: int = 0, rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(rows, 4))
    return x, x.sum(1)


def train(model_dir: Path, data: tuple[np.ndarray, ...], seed: int, epochs: int = 1) -> int:
    """fit on an ArrayInput; the global step trained to."""
    import tf_keras as keras

    keras.backend.set_floatx("float64")
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    context = TaskContext("chief", 0, label="chief:0", run_id=f"run-{next(RUNS)}", progress_file=model_dir.parent / "progress.json",
                          progress_log=model_dir.parent / "steps.jsonl")
    train_input = jobkit.ArrayInput(data, global_batch=BATCH, seed=seed)
    jobkit.fit(model, train_input, context=context, model_dir=model_dir, epochs=epochs, global_batch_size=BATCH,
               steps_per_execution=1)
    return int(model.optimizer.iterations.numpy())


@pytest.mark.parametrize("changed, field, was, now", [
    ({"seed": 2}, "seed", "1", "2"),
    ({"data": arrays(seed=5)}, "data", None, None),  # as many examples, other ones (--dataset fashion_mnist)
    ({"data": arrays(rows=24)}, "examples", "32", "24"),  # the offline digits where the run began on MNIST
])
def test_a_resume_on_another_seed_or_other_data_is_refused_naming_the_field(
        tmp_path: Path, changed: dict[str, object], field: str, was: str | None, now: str | None) -> None:
    model_dir = tmp_path / "model"
    assert train(model_dir, arrays(), seed=1) == 4
    assert json.loads((model_dir / IDENTITY).read_text())["seed"] == 1
    write_backup_at(model_dir, 3, 4)  # a run stopped after step 3
    with pytest.raises(JobKitError) as refused:
        train(model_dir, changed.get("data", arrays()), seed=int(changed.get("seed", 1)), epochs=2)  # type: ignore[call-overload]
    message = str(refused.value)
    assert message.startswith(f"the input's {field} is "), message
    if was is not None:
        assert message.startswith(f"the input's {field} is {now} but this run began with {was}, so the resume "), message
    assert str(model_dir / IDENTITY) in message and "\n" not in message


def test_a_resume_on_the_same_input_goes_on_and_a_fresh_start_records_the_new_one(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    assert train(model_dir, arrays(), seed=1) == 4
    write_backup_at(model_dir, 3, 4)
    assert train(model_dir, arrays(), seed=1, epochs=2) == 8 - 3  # the restore brings no weights nor step count
    assert train(model_dir, arrays(), seed=2) == 4  # no backup: a new run in the same dir, nothing resumed
    assert json.loads((model_dir / IDENTITY).read_text())["seed"] == 2


def test_the_identity_is_private_and_so_is_the_model_dir_it_makes(tmp_path: Path) -> None:
    model_dir = tmp_path / "new" / "model"
    train(model_dir, arrays(), seed=1)
    assert [oct(p.stat().st_mode & 0o777) for p in (model_dir.parent, model_dir, model_dir / IDENTITY)] == \
        ["0o700", "0o700", "0o600"]


def test_jobs_mnist_refuses_a_resume_on_another_seed_in_one_line(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / IDENTITY).write_text(json.dumps({"kind": "ArrayInput", "seed": 3}))  # as the run's first attempt left it
    write_backup_at(model_dir, 5, 93)
    job = start_job("chief:0", tmp_path / "run", ["--epochs", "1", "--batch-size", "16", "--seed", "4",
                                                  "--model-dir", str(model_dir)])
    try:
        codes = wait_all([job], 300)
    finally:
        kill_all([job])
    assert_none_alive([job])
    output = job.output()
    assert codes == {"chief:0": 1}, output[-3000:]
    assert output.rstrip().splitlines()[-1].startswith("mnist: the input's seed is 4 but this run began with 3, "), \
        output[-3000:]
    assert "Traceback" not in output and not job.step_records(), output[-3000:]
