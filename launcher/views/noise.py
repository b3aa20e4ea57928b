"""TensorFlow's known start-up noise: the lines the console hides unless ``--verbose``.

A task without ``TF_CPP_MIN_LOG_LEVEL`` prints about fifteen lines of TensorFlow's own
before the job says anything: the oneDNN notice, the CUDA stub lines, ``failed call to
cuInit`` at error level on every machine without a CUDA driver, absl's pre-init warning,
the gRPC server and coordination-service lines. ``tfl launch`` and ``tfl logs`` hide
exactly these (the task's log file keeps every line) and say per task how many they hid.

The rule is a list, not a level: a line is hidden only when its C++ source file, its
level and its whole message match an entry below. Anything else (any other warning or
error, a traceback, the job's own output) is shown. ``tests/test_noise_tf.py`` checks the
list against the output of real TensorFlow tasks, so a TensorFlow upgrade that changes
these lines fails a test instead of hiding something new.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# A C++ log line in absl's format (TensorFlow >= 2.16) or TensorFlow's older one:
#   I0000 00:00:1795345087.532342    2334 port.cc:153] oneDNN custom operations are on. …
#   2024-01-02 03:04:05.678901: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on. …
_CPP = re.compile(r"(?:(?P<absl>[IWEF])\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\d [\d:.]+: (?P<tf>[IWEF]) )"
                  r"(?:\S*/)?(?P<file>[\w.]+):\d+\] (?P<message>.*)")
_TASK = r"/job:\w+/replica:\d+/task:\d+"


@dataclass(frozen=True)
class Noise:
    """One known line: who logs it (C++ source files; none for a bare line), at which
    levels, its whole message; the lines that continue it; and ``after``: noise only once
    a line of that kind was seen in the same task's output."""

    kind: str
    files: tuple[str, ...]
    levels: str
    message: re.Pattern[str]
    continuation: re.Pattern[str] | None = None
    after: str | None = None


def _noise(kind: str, files: tuple[str, ...], levels: str, message: str, continuation: str | None = None,
           after: str | None = None) -> Noise:
    return Noise(kind, files, levels, re.compile(message), re.compile(continuation) if continuation else None, after)


KNOWN: tuple[Noise, ...] = (
    _noise("absl pre-init warning", (), "", r"WARNING: All log messages before absl::InitializeLog\(\) is called "
           r"are written to STDERR"),
    _noise("oneDNN notice", ("port.cc",), "I", r"oneDNN custom operations are on\. You may see slightly different "
           r"numerical results .*TF_ENABLE_ONEDNN_OPTS=0`\."),
    _noise("CUDA stub", ("cudart_stub.cc",), "I", r"Could not find cuda drivers on your machine, GPU will not be used\."),
    _noise("CPU features", ("cpu_feature_guard.cc",), "I", r"This TensorFlow binary is optimized to use available CPU "
           r"instructions in performance-critical operations\.",
           continuation=r"To enable the following instructions: [\w ,]+, in other operations, rebuild TensorFlow "
                        r"with the appropriate compiler flags\."),
    # An error, but the expected one where the CUDA stub said there is no driver (only then).
    _noise("cuInit without a driver", ("cuda_platform.cc", "cuda_executor.cc", "cuda_driver.cc"), "E",
           r"failed call to cuInit: .*", after="CUDA stub"),
    _noise("gRPC server", ("grpc_server_lib.cc",), "I", r"Started server with target: grpc://\S+"),
    _noise("coordination service", ("coordination_service.cc",), "I",
           r"Initializing CoordinationService|Waiting for \d+/\d+ tasks to connect\.|"
           r"Barrier\(\S+\) has passed with status: OK"),
    _noise("coordination service", ("coordination_service.cc",), "I", r"Example stragglers:",
           continuation=_TASK),
    _noise("coordination service", ("coordination_service.h",), "I",
           _TASK + r" has connected to coordination service\. Incarnation: \d+"),
    _noise("coordination service", ("coordination_service_agent.cc",), "I",
           r"Coordination agent has successfully connected\."),
    _noise("tf.data memory patch", ("generator_dataset_op.cc",), "I",
           r"Memory patch applied: M_TRIM_THRESHOLD=\d+ kb was set\."),
)


def known(line: str) -> Noise | None:
    """The entry of ``KNOWN`` a line is, on its own (no continuation, no ``after``)."""
    line = line.rstrip("\r")
    cpp = _CPP.fullmatch(line)
    for noise in KNOWN:
        if not noise.files:
            if noise.message.fullmatch(line):
                return noise
        elif cpp and cpp["file"] in noise.files and (cpp["absl"] or cpp["tf"]) in noise.levels \
                and noise.message.fullmatch(cpp["message"]):
            return noise
    return None


class NoiseFilter:
    """One task's output, line by line: which lines are known noise, and how many were."""

    def __init__(self) -> None:
        self.hidden: Counter[str] = Counter()  # kind -> lines hidden
        self._seen: set[str] = set()
        self._continued: Noise | None = None

    @property
    def count(self) -> int:
        return sum(self.hidden.values())

    def is_noise(self, line: str) -> bool:
        continued, self._continued = self._continued, None
        if continued is not None and continued.continuation and continued.continuation.fullmatch(line.rstrip("\r")):
            self._continued = continued  # a message may go on for several lines
            self.hidden[continued.kind] += 1
            return True
        noise = known(line)
        if noise is None or (noise.after is not None and noise.after not in self._seen):
            return False
        self._seen.add(noise.kind)
        self._continued = noise if noise.continuation else None
        self.hidden[noise.kind] += 1
        return True
