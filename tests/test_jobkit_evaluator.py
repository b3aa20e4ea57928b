"""The evaluator loop and the bounded MNIST download, in-process with a tiny model."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher import jobkit
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.layout import ModelDirLayout, write_json_atomically

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow


@dataclass
class TinyJob:
    tf: Any
    data: Any

    def build(self) -> Any:
        import tf_keras as keras

        model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model


@pytest.fixture(scope="module")
def tiny() -> TinyJob:
    import tensorflow as tf  # here, not at the top: collecting fast tests must not load TF

    features = tf.random.stateless_normal((32, 4), seed=(1, 2))
    return TinyJob(tf, tf.data.Dataset.from_tensor_slices((features, tf.zeros(32, tf.int64))).batch(8))


class ChiefSimulator:
    """Plays the chief between the evaluator's polls, one scripted action per sleep."""

    def __init__(self, tiny: TinyJob, model_dir: Path, script: list[str]) -> None:
        self._layout = ModelDirLayout(model_dir)
        self._model = tiny.build()
        self._manager = tiny.tf.train.CheckpointManager(
            tiny.tf.train.Checkpoint(model=self._model), str(self._layout.checkpoints),
            max_to_keep=5, checkpoint_name="ckpt")
        self._script = script
        self.sleeps = 0

    def sleep(self, _seconds: float) -> None:
        self.sleeps += 1
        action = self._script.pop(0) if self._script else "idle"
        if action.startswith("ckpt-"):
            kernel = self._model.layers[0].kernel
            kernel.assign_add(kernel * 0.5 + 0.1)  # each checkpoint holds different weights
            self._manager.save(checkpoint_number=int(action.removeprefix("ckpt-")))
        elif action.startswith("done:"):  # done:ckpt-2 or done:ckpt-2:run-id
            final, _, run_id = action.removeprefix("done:").partition(":")
            write_json_atomically(self._layout.done_file, {"final_checkpoint": final, "run_id": run_id or None})
        elif action == "beat":  # the chief's progress record, rewritten while it trains
            write_json_atomically(self._layout.training_progress, {"global_step": self.sleeps, "time": self.sleeps})


def test_evaluator_waits_for_checkpoints_and_the_done_marker(
    tiny: TinyJob, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.jobkit.evaluator import run_evaluator

    chief = ChiefSimulator(tiny, tmp_path, ["idle", "ckpt-1", "idle", "ckpt-2", "done:ckpt-2"])
    progress = tmp_path / "eval.progress.json"
    context = TaskContext("evaluator", 0, label="evaluator:0", progress_file=progress)
    count = run_evaluator(tiny.build(), tiny.data, context=context, model_dir=tmp_path, epochs=2,
                          sleep=chief.sleep)
    assert count == 2
    assert chief.sleeps == 5  # it kept polling through "no checkpoint yet" until the marker
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("eval ")]
    assert [ln.split(" loss=")[0] for ln in lines] == [
        "eval checkpoint=ckpt-1 epoch=1", "eval checkpoint=ckpt-2 epoch=2"]
    events = list((tmp_path / "tensorboard" / "eval").glob("events.out.tfevents.*"))
    assert events and b"epoch_accuracy" in events[0].read_bytes()
    losses = {float(ln.split("loss=")[1].split()[0]) for ln in lines}
    assert len(losses) == 2  # two different checkpoints were really restored
    final = json.loads(progress.read_text())
    assert final["phase"] == "done" and final["epoch"] == 2 and final["epochs"] == 2
    assert final["loss"] == pytest.approx(float(lines[-1].split("loss=")[1].split()[0]), abs=1e-6)


def test_evaluator_gives_up_after_the_idle_timeout(tiny: TinyJob, tmp_path: Path) -> None:
    from launcher.jobkit.evaluator import EvaluatorTimeout, run_evaluator

    clock = iter(range(0, 10_000, 100))  # every look at the clock: 100 s later
    with pytest.raises(EvaluatorTimeout, match="no new checkpoint .* for 600 s"):
        run_evaluator(tiny.build(), tiny.data, context=TaskContext("evaluator", 0),
                      model_dir=tmp_path, clock=lambda: float(next(clock)), sleep=lambda _s: None)


def test_evaluator_follows_the_chief_through_a_long_epoch(tiny: TinyJob, tmp_path: Path) -> None:
    """No checkpoint for 10 looks of 100 s each (longer than the limit), but the chief's
    progress record keeps changing: training is alive, so the evaluator waits. The old
    evaluator died 600 s after the last checkpoint, whatever the chief was doing."""
    from launcher.jobkit.evaluator import EvaluatorTimeout, run_evaluator

    chief = ChiefSimulator(tiny, tmp_path, ["ckpt-1", *["beat"] * 10, "ckpt-2", "done:ckpt-2"])
    clock = iter(range(0, 100_000, 100))
    count = run_evaluator(tiny.build(), tiny.data, context=TaskContext("evaluator", 0), model_dir=tmp_path,
                          idle_timeout_s=250, clock=lambda: float(next(clock)), sleep=chief.sleep)
    assert count == 2
    # Once the record stops changing, the limit applies again.
    stalled = ChiefSimulator(tiny, tmp_path / "stalled", ["ckpt-1", "beat"])
    with pytest.raises(EvaluatorTimeout, match="no change in training_progress.json .* for 250 s"):
        run_evaluator(tiny.build(), tiny.data, context=TaskContext("evaluator", 0), model_dir=tmp_path / "stalled",
                      idle_timeout_s=250, clock=lambda: float(next(clock)), sleep=stalled.sleep)


def test_evaluator_without_a_limit_waits(tiny: TinyJob, tmp_path: Path) -> None:
    from launcher.jobkit.evaluator import run_evaluator

    chief = ChiefSimulator(tiny, tmp_path, ["idle"] * 30 + ["ckpt-1", "done:ckpt-1"])
    clock = iter(range(0, 100_000, 1000))
    assert run_evaluator(tiny.build(), tiny.data, context=TaskContext("evaluator", 0), model_dir=tmp_path,
                         idle_timeout_s=None, clock=lambda: float(next(clock)), sleep=chief.sleep) == 1


def test_evaluator_ignores_the_done_marker_of_another_run(
    tiny: TinyJob, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reused model dir holds the previous run's marker; the old evaluator took it and
    exited at once, before this run's chief had even removed it."""
    from launcher.jobkit.evaluator import run_evaluator

    ChiefSimulator(tiny, tmp_path, []).sleep(0)  # nothing yet
    write_json_atomically(ModelDirLayout(tmp_path).done_file, {"final_checkpoint": None, "run_id": "old-run"})
    chief = ChiefSimulator(tiny, tmp_path, ["idle", "ckpt-1", "ckpt-2", "done:ckpt-2:new-run"])
    context = TaskContext("evaluator", 0, run_id="new-run")
    assert run_evaluator(tiny.build(), tiny.data, context=context, model_dir=tmp_path, sleep=chief.sleep) == 2
    out = capsys.readouterr().out
    assert out.count("evaluator ignores training_done.json of run old-run (this is run new-run)") == 1
    assert "eval checkpoint=ckpt-2" in out


def test_evaluator_fails_if_the_final_checkpoint_is_missing(tiny: TinyJob, tmp_path: Path) -> None:
    from launcher.jobkit.evaluator import run_evaluator

    chief = ChiefSimulator(tiny, tmp_path, ["ckpt-1", "done:ckpt-9"])
    with pytest.raises(JobKitError, match="final checkpoint ckpt-9"):
        run_evaluator(tiny.build(), tiny.data, context=TaskContext("evaluator", 0),
                      model_dir=tmp_path, sleep=chief.sleep)


def test_checkpoint_epoch_from_name() -> None:
    from launcher.jobkit.evaluator import checkpoint_epoch

    assert checkpoint_epoch("/m/checkpoints/ckpt-12") == 12
    assert checkpoint_epoch("/m/checkpoints/weights") is None


def test_mnist_download_gives_up_on_a_silent_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy that accepts but never answers stands in for a black-holed network."""
    from launcher.jobkit import datasets

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setenv("HOME", str(tmp_path))  # no keras cache
    for var in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{silent.getsockname()[1]}")
    try:
        started = time.monotonic()
        assert datasets._try_download(2.0, "mnist", lambda: datasets._load_from_keras("mnist")) is None
        assert time.monotonic() - started < 60  # a hang guard: the 2 s timeout held, the silent proxy did not
    finally:
        silent.close()


def test_evaluator_takes_the_model_dir_as_a_string(tiny: TinyJob, tmp_path: Path) -> None:
    from launcher.jobkit.evaluator import run_evaluator

    chief = ChiefSimulator(tiny, tmp_path, ["ckpt-1", "done:ckpt-1"])
    context = TaskContext("evaluator", 0, label="evaluator:0", progress_file=tmp_path / "eval.progress.json")
    assert run_evaluator(tiny.build(), tiny.data, context=context, model_dir=str(tmp_path), epochs=1,
                         sleep=chief.sleep) == 1


def test_a_resumed_evaluator_goes_on_after_what_its_earlier_attempt_evaluated(
    tiny: TinyJob, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tfl resume` restarts the evaluator: it evaluated every checkpoint of the run again from ckpt-1."""
    from launcher.jobkit.evaluator import run_evaluator

    progress = tmp_path / "eval.progress.json"
    write_json_atomically(progress, {"task": "evaluator:0", "attempt": 0, "phase": "eval", "epoch": 2})
    chief = ChiefSimulator(tiny, tmp_path, ["ckpt-1", "ckpt-2", "ckpt-3", "done:ckpt-3"])
    context = TaskContext("evaluator", 0, label="evaluator:0", attempt=1, progress_file=progress)
    assert run_evaluator(tiny.build(), tiny.data, context=context, model_dir=tmp_path, epochs=3, sleep=chief.sleep) == 1
    out = capsys.readouterr().out
    assert "eval checkpoint=ckpt-3" in out and "checkpoint=ckpt-1 " not in out and "checkpoint=ckpt-2 " not in out


def test_an_evaluator_that_starts_first_makes_the_model_dir_private(tiny: TinyJob, tmp_path: Path) -> None:
    """The evaluator starts before the chief (no collective to join): TensorFlow's summary writer made
    ``<storage>/<run id>/model`` with mkdir's 0755, so the README's own run left its model dir listable."""
    from launcher.jobkit.evaluator import run_evaluator

    model_dir = tmp_path / "shared" / "run-1" / "model"
    chief = ChiefSimulator(tiny, model_dir, ["ckpt-1", "done:ckpt-1"])
    context = TaskContext("evaluator", 0, label="evaluator:0", progress_file=tmp_path / "eval.progress.json")
    old = os.umask(0o022)
    try:
        assert run_evaluator(tiny.build(), tiny.data, context=context, model_dir=model_dir, epochs=1,
                             sleep=chief.sleep) == 1
    finally:
        os.umask(old)
    modes = {d.name: stat.S_IMODE(d.stat().st_mode) for d in (model_dir.parent.parent, model_dir.parent, model_dir)}
    assert modes == dict.fromkeys(["shared", "run-1", "model"], 0o700)
