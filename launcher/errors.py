"""The launcher's own faults.

Task failures are *results* (see ``supervisor.TaskFailure``); these exceptions are for
problems of the launcher itself or of its input. Every message is one line that says
what was wrong and how to fix it; the CLI prints it and exits non-zero, never a traceback.
"""

ERROR_PREFIX = "tfl: error: "  # how the CLI says one (a detached launcher's refusal is read back by it)


class TflError(Exception):
    """Base of every error the CLI reports as a one-line message."""

    exit_code = 2


class ClusterFileError(TflError):
    """The cluster description is missing, unreadable or invalid."""


class UsageError(TflError):
    """Options that contradict each other or name things that do not exist."""


class LaunchError(TflError):
    """A task could not be started (port busy, python missing, host unreachable)."""


class NoPrivateNetwork(LaunchError):
    """A run that must be private (``--network private``, or a resumed private run) where this machine
    cannot make a network namespace: ``reason``, and the ``fix`` that would let it."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"--network private: this machine cannot make a network namespace ({reason}); {fix}, "
                         "or run with --network host")
        self.reason, self.fix = reason, fix

    def resuming(self, run_id: str) -> LaunchError:
        """The refusal as ``tfl resume`` says it: it has no ``--network``, and the launch may have been ``auto``."""
        return LaunchError(f"run {run_id} ran in a network namespace of its own, and this machine cannot make one now "
                           f"({self.reason}); {self.fix} to resume it: a resumed run keeps its network (docs/security.md)")


class RunNotFoundError(TflError):
    """``tfl status/logs/stop RUN`` named a run the store does not have."""


class ExportError(TflError):
    """`tfl export`: the chosen format cannot express the cluster, or an option is invalid."""


class RunExistsError(TflError):
    """A new run's directory exists already: run dirs are never shared."""


class StateWriteError(TflError):
    """A run's record could not be saved (disk full, permissions): the run cannot be recorded."""


class UnreadableRunError(TflError):
    """The run asked for (or the latest one) has a record this tfl cannot read, e.g. a newer tfl's."""


class ResourceLimitError(LaunchError):
    """The launcher itself ran short (open files, kernel buffers): its own limit, never a host's fault
    (``launcher.limits`` says which limit and the fix)."""


class InterruptedLaunchError(TflError):
    """SIGTERM or SIGHUP came while the hosts were being made ready, before the run existed: nothing
    ran, what was shipped is removed again, and the exit code is the signal's (128 + its number)."""
