"""jobkit.fit in-process with a tiny model: per-call progress is the true running loss,
backups count steps whatever the steps per call, and a restarted attempt of a run whose
training had finished does not train again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher import jobkit
from launcher.jobkit.context import TaskContext

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow

FEATURES = np.random.default_rng(7).normal(size=(96, 4)).astype("float32")
LABELS = (np.arange(96) % 3).astype("int64")
BATCH = 8


def build(learning_rate: float = 0.1) -> Any:
    import tf_keras as keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def batches() -> Any:
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(BATCH, drop_remainder=True).repeat()


def context(tmp_path: Path, run_id: str | None = "run-1", attempt: int = 0) -> TaskContext:
    return TaskContext("chief", 0, label="chief:0", run_id=run_id, attempt=attempt,
                       progress_file=tmp_path / f"progress-{attempt}.json", progress_log=tmp_path / f"steps-{attempt}.jsonl")


def records(tmp_path: Path, attempt: int = 0) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / f"steps-{attempt}.jsonl").read_text().splitlines()]


def test_per_call_progress_is_the_true_running_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With 3 steps per call, a record every 3 steps holding the epoch's running mean loss.

    The learning rate is 0, so each batch's loss can be computed apart from the fit."""
    import tensorflow as tf

    model = build(learning_rate=0.0)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_batch = [float(loss(LABELS[i:i + BATCH], model(FEATURES[i:i + BATCH]))) for i in range(0, 96, BATCH)]
    jobkit.fit(model, batches(), context=context(tmp_path), model_dir=tmp_path / "model", epochs=1,
               global_batch_size=BATCH, steps_per_epoch=12, steps_per_execution=3)
    train = [r for r in records(tmp_path) if r["phase"] == "train"]
    assert [r["step"] for r in train] == [3, 6, 9, 12, 12]  # one per call, then the epoch's end
    for record in train:
        expected = float(np.mean(per_batch[:record["step"]]))
        assert record["loss"] == pytest.approx(expected, abs=1e-6), record
        assert record["global_step"] == record["step"]
    assert "steps per call of the train function: 3 (metrics read once per call)" in capsys.readouterr().out


class CrashAfter:
    """A callback that fails the fit once a call has ended at or after `step`."""

    def __new__(cls, step: int) -> Any:
        import tf_keras as keras

        class Crash(keras.callbacks.Callback):  # type: ignore[misc]
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if batch + 1 >= step:
                    raise RuntimeError(f"crash after step {batch + 1}")

        return Crash()


def test_backups_count_steps_not_calls(tmp_path: Path) -> None:
    """Backups every 4 steps at 2 steps per call; killed after step 6, attempt 1 resumes at step 5.

    keras' own BackupAndRestore counts calls (it would first back up at step 8) and
    records a call's first step as done, so the restart would repeat a step."""
    args: dict[str, Any] = dict(model_dir=tmp_path / "model", epochs=2, global_batch_size=BATCH, steps_per_epoch=10,
                                backup_every_steps=4, steps_per_execution=2)
    with pytest.raises(RuntimeError, match="crash after step 6"):
        jobkit.fit(build(), batches(), context=context(tmp_path), callbacks=[CrashAfter(6)], **args)
    assert [r["step"] for r in records(tmp_path)] == [2, 4, 6]
    jobkit.fit(build(), batches(), context=context(tmp_path, attempt=1), **args)
    resumed = records(tmp_path, attempt=1)
    # A tf.data input replays the 4 steps backed up before its first call: said first (phase "replay"), then trained on.
    assert {k: resumed[0][k] for k in ("phase", "global_step")} == {"phase": "replay", "global_step": 4}
    assert {k: resumed[1][k] for k in ("epoch", "step", "global_step")} == {"epoch": 1, "step": 6, "global_step": 6}
    assert resumed[-1]["phase"] == "done" and resumed[-1]["global_step"] == 20


def test_a_restarted_attempt_of_a_finished_run_does_not_train_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure after fit (in finish(), or an export) restarts the group; the backup is gone by
    then, so without the done marker the new attempt would train from scratch."""
    model_dir = tmp_path / "model"
    trained = build()
    jobkit.fit(trained, batches(), context=context(tmp_path), model_dir=model_dir, epochs=2, global_batch_size=BATCH,
               steps_per_epoch=5)
    assert not list((model_dir / "backup").iterdir())  # keras removed it at the end of training
    capsys.readouterr()

    again = build()
    history = jobkit.fit(again, batches(), context=context(tmp_path, attempt=1), model_dir=model_dir, epochs=2,
                         global_batch_size=BATCH, steps_per_epoch=5)
    out = capsys.readouterr().out
    assert history.history == {} and "epoch 1/2" not in out
    assert "attempt 0 of run run-1 already finished training (ckpt-2, global step 10); not training again" in out
    for a, b in zip(trained.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # the final checkpoint's weights, ready for an export step
    assert json.loads((tmp_path / "progress-1.json").read_text())["phase"] == "done"

    # Another run reusing the model dir (or a run by hand, which has no run id) trains anew.
    for other in ("run-2", None):
        jobkit.fit(build(), batches(), context=context(tmp_path, run_id=other), model_dir=model_dir, epochs=1,
                   global_batch_size=BATCH, steps_per_epoch=5)
        assert "epoch 1/1" in capsys.readouterr().out
        assert json.loads((model_dir / "training_done.json").read_text())["run_id"] == other


def test_the_done_marker_is_written_while_the_backup_still_exists(tmp_path: Path) -> None:
    from launcher.jobkit.backup import StepBackup

    backup = tmp_path / "backup"
    seen: list[bool] = []
    build().fit(batches(), epochs=1, steps_per_epoch=3, verbose=0,
                callbacks=[StepBackup(str(backup), None, on_trained=lambda: seen.append(bool(list(backup.rglob("*.index")))))])
    assert seen == [True] and not list(backup.rglob("*.index"))


def test_linear_scaling_warms_up_from_the_one_replica_rate() -> None:
    from launcher.jobkit.schedules import LinearWarmup, learning_rate

    class FourReplicas:
        num_replicas_in_sync = 4

    schedule = learning_rate(1e-3, FourReplicas(), scaling="linear", warmup_epochs=0.5, steps_per_epoch=10)
    assert isinstance(schedule, LinearWarmup)
    assert [float(schedule(step)) for step in (0, 1, 5, 50)] == pytest.approx([1e-3, 1.6e-3, 4e-3, 4e-3])
    assert learning_rate(1e-3, FourReplicas(), scaling="linear") == pytest.approx(4e-3)
    assert learning_rate(1e-3, FourReplicas()) == 1e-3


def test_a_custom_train_step_runs_several_steps_per_call_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keras' own train function then; built so that it follows later changes of steps per call."""
    import tf_keras as keras

    class Custom(keras.Sequential):  # type: ignore[misc]
        def train_step(self, data: Any) -> Any:
            return super().train_step(data)

    model = Custom([keras.Input(shape=(4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    jobkit.fit(model, batches(), context=context(tmp_path), model_dir=tmp_path / "model", epochs=1,
               global_batch_size=BATCH, steps_per_epoch=12, steps_per_execution=3)
    train = [r for r in records(tmp_path) if r["phase"] == "train"]
    assert [(r["step"], r["global_step"]) for r in train] == [(3, 3), (6, 6), (9, 9), (12, 12), (12, 12)]
    assert "steps per call of the train function: 3 (keras' train function)" in capsys.readouterr().out


def test_the_chosen_steps_per_call_keep_backups_every_n_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chosen after 35 one-step calls, it divides the backup interval and the epoch, and takes
    effect on a multiple of itself: every backup still falls on a multiple of 10 steps."""
    import re

    from launcher.jobkit.backup import StepBackup

    backed_up: list[int] = []
    original = StepBackup._backup

    def spy(self: StepBackup, epoch: int, batch: int = 0) -> None:
        backed_up.append(epoch * 60 + batch + 1)
        original(self, epoch=epoch, batch=batch)

    monkeypatch.setattr(StepBackup, "_backup", spy)
    jobkit.fit(build(), batches(), context=context(tmp_path), model_dir=tmp_path / "model", epochs=2,
               global_batch_size=BATCH, steps_per_epoch=60, backup_every_steps=10)
    chosen = int(re.search(r"; (\d+) steps per call", capsys.readouterr().out)[1])  # type: ignore[index]
    assert chosen > 1 and 10 % chosen == 0
    assert backed_up == list(range(10, 121, 10))
    late = [r["step"] for r in records(tmp_path) if r["phase"] == "train" and r["epoch"] == 2]
    assert late and all(step % chosen == 0 for step in late), late


def test_examples_per_sec_leave_out_the_time_of_callbacks(tmp_path: Path) -> None:
    """A callback that takes 200 ms per call (a backup, say) does not count: the rate is the train function's.
    (The second epoch's: the first one's includes tracing the function.) The sleep dwarfs a step of
    this tiny model on any machine, however loaded, so the bound below holds only if it is left out."""
    import time

    import tf_keras as keras

    slow = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.2))
    jobkit.fit(build(), batches(), context=context(tmp_path), model_dir=tmp_path / "model", epochs=2,
               global_batch_size=BATCH, steps_per_epoch=12, steps_per_execution=1, callbacks=[slow])
    done = records(tmp_path)[-1]
    with_callbacks = 12 * BATCH / (12 * 0.2)  # the most the whole epoch's time could give
    assert done["phase"] == "done" and done["examples_per_sec"] > 2 * with_callbacks, done


@pytest.mark.parametrize("users", [False, True])
def test_the_slow_hook_warning_is_shown_only_for_the_users_callbacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, users: bool) -> None:
    """tf_keras warns "Callback method `on_train_batch_end` is slow ... Check your callbacks." when
    the hooks of the first batches outlast the batch. Here one of the kit's own hooks takes 50 ms
    (on a busy machine a context switch is enough): hidden when the user gave no callback, shown
    when they did (it may be theirs)."""
    import logging
    import time

    import tf_keras as keras

    from launcher.jobkit.callbacks import ProgressCallback

    kits = ProgressCallback.on_train_batch_end

    def slow(self: Any, batch: int, logs: Any = None) -> None:
        time.sleep(0.05)
        kits(self, batch, logs)

    monkeypatch.setattr(ProgressCallback, "on_train_batch_end", slow)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        jobkit.fit(build(), batches(), context=context(tmp_path), model_dir=tmp_path / "model", epochs=1,
                   global_batch_size=BATCH, steps_per_epoch=12, steps_per_execution=1,
                   callbacks=[keras.callbacks.LambdaCallback()] if users else ())
    finally:
        logger.removeHandler(handler)
    slow_said = [m for m in said if "Callback method `on_train_batch_end` is slow compared to the batch time" in m]
    assert bool(slow_said) is users, said
    assert logger.filters == []  # the fit's filter is gone after it


def test_fit_takes_the_model_dir_as_a_string(tmp_path: Path) -> None:
    """A job passing `model_dir="/some/dir"` trained nothing: `str / str` deep in the kit's layout."""
    jobkit.fit(build(), batches(), context=context(tmp_path), model_dir=str(tmp_path / "model"), epochs=1,
               global_batch_size=BATCH, steps_per_epoch=3)
    assert (tmp_path / "model" / "training_done.json").exists()
    assert list((tmp_path / "model" / "checkpoints").glob("ckpt-1*"))


NOTICE_AT_AN_EPOCHS_END = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from launcher import jobkit
jobkit.select_tf_keras()
import numpy as np
import tf_keras as keras

class NoticeAt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:  # TensorFlow's watcher takes it in within a second; the step agreed is then
            os.kill(os.getpid(), signal.SIGTERM)  # the end of the call after the next: epoch 1's last
            time.sleep(2.5)

keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
data = jobkit.ArrayInput((np.ones((32, 4), "float32"), np.zeros(32, "int64")), global_batch=8, seed=1)
context = jobkit.task_context()
jobkit.make_strategy(context)
jobkit.fit(model, data, context=context, model_dir={model_dir!r}, epochs=2, steps_per_epoch=4, global_batch_size=8,
           steps_per_execution=1, callbacks=[NoticeAt()])
"""


def preempted_at_an_epochs_end(model_dir: Path) -> Any:
    """NOTICE_AT_AN_EPOCHS_END run alone (a lone chief): its completed process, exit code 170 checked."""
    import os
    import subprocess
    import sys

    from launcher.contract import PREEMPTED_EXIT_CODE
    from tests.conftest import ROOT

    script = model_dir.parent / "job.py"
    script.write_text(NOTICE_AT_AN_EPOCHS_END.format(root=str(ROOT), model_dir=str(model_dir)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFL_"))}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def test_a_notice_at_an_epochs_last_step_keeps_the_epochs_end(tmp_path: Path) -> None:
    """The agreed checkpoint at an epoch's last step: the task left before the epoch's end, and the
    resume began the next epoch, so that epoch's line, checkpoint and evaluation never came."""
    model_dir = tmp_path / "model"
    out = preempted_at_an_epochs_end(model_dir)
    assert "epoch 1/2 loss=" in out.stdout
    assert list((model_dir / "checkpoints").glob("ckpt-1.index"))
    record = json.loads((model_dir / "preempted.json").read_text())
    assert (record["epoch"], record["step"], record["global_step"]) == (1, 4, 4)


def test_the_agreed_save_prints_no_deprecation_warning(tmp_path: Path) -> None:
    """TensorFlow's save read its own deprecated `total_run_calls`: 6 lines of warning per task per preemption."""
    out = preempted_at_an_epochs_end(tmp_path / "model")
    assert "deprecated" not in out.stdout + out.stderr


def test_an_endless_dataset_without_steps_per_epoch_is_refused(tmp_path: Path) -> None:
    """`dataset.repeat()` and no steps_per_epoch: the first epoch never ended, training ran for ever."""
    with pytest.raises(jobkit.JobKitError, match="repeats for ever and fit got no steps_per_epoch"):
        jobkit.fit(build(), batches(), context=context(tmp_path), model_dir=tmp_path / "model", epochs=1,
                   global_batch_size=BATCH, callbacks=[CrashAfter(50)])  # without the check: a crash, not a hang


def test_a_replay_says_so_in_the_progress_and_is_left_out_of_the_rate(tmp_path: Path) -> None:
    """A plain pipeline resumed at step 30 reads and drops 30 batches inside the first step. The progress
    said nothing during that replay (`tfl status`: "-"), and the first examples/s counted it in. Each
    replayed batch here costs 0.2 s (6 s in all); the batches trained after it cost nothing extra."""
    import time

    import tensorflow as tf

    from tests.jobkit_helpers import write_backup_at

    resume, steps, slow_s = 30, 12, 0.2
    write_backup_at(tmp_path / "model", resume, steps)  # epoch 3, step 6 of 12

    def wait(index: Any) -> Any:
        if int(index) < resume:
            time.sleep(slow_s)
        return index

    def slow_before_the_resume(index: Any, batch: Any) -> Any:
        with tf.control_dependencies([tf.py_function(wait, [index], tf.int64)]):
            return tf.identity(batch[0]), tf.identity(batch[1])

    replayed = batches().enumerate().map(slow_before_the_resume)
    jobkit.fit(build(), replayed, context=context(tmp_path), model_dir=tmp_path / "model", epochs=3,
               global_batch_size=BATCH, steps_per_epoch=steps, steps_per_execution=1)
    written = records(tmp_path)
    assert [(r["phase"], r["global_step"], r["epoch"], r["step"]) for r in written[:1]] == [("replay", resume, 3, 6)]
    # The record after the replay's call has no rate yet (0: `tfl status` shows none); each later one
    # times the training calls alone.
    rates = [r["examples_per_sec"] for r in written if r["phase"] == "train" and r["epoch"] == 3]
    counted_in = (steps - 6) * BATCH / (resume * slow_s)  # the most the epoch's rate could be, the replay counted in
    assert rates[0] == 0.0 and len(rates) > 1 and all(rate > 4 * counted_in for rate in rates[1:]), rates
