"""The ``tfl`` application and what its commands share: the typer app, one-line errors,
the call into the core, the run store, colour, run-id completion."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from launcher.cli.coercion import plain_values
from launcher.errors import ERROR_PREFIX, TflError


def _help_flag_false(option: Any) -> Any:
    """typer 0.29 leaves ``--help``'s value None when it is not given, so every command call
    builds a pydantic TypeAdapter to coerce that None (a third of `tfl status`'s time,
    docs/benchmarks.md §1). With False, a bool, typer skips the coercion; nothing else changes."""
    if option is not None:
        option.default = False
    return option


_COMPLETION_FLAGS = ("install_completion", "show_completion")


class _Group(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag_false(super().get_help_option(ctx))

    def get_params(self, ctx: Any) -> list[Any]:
        # typer's --install-completion / --show-completion default to None too: the same fix.
        return [_help_flag_false(p) if p.name in _COMPLETION_FLAGS and p.default is None else p
                for p in super().get_params(ctx)]


class _Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_values(self.params)  # no pydantic TypeAdapter for a plain value (launcher.cli.coercion)

    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag_false(super().get_help_option(ctx))


class _JobCommand(_Command):
    """A command given a job and the job's own arguments (launch, export k8s): an option it does
    not know is most likely the job's, given before the `--` that must precede them."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        from typer._click.exceptions import NoSuchOption  # typer's own click

        try:
            return list(super().parse_args(ctx, args))
        except NoSuchOption as exc:
            exc.message = (f"{exc.format_message()}; if it is the job's, give it after `--`, e.g. "
                           f"`{ctx.command_path} JOB --local 2 -- {exc.option_name} …`")
            exc.possibilities = None  # said above, before the hint
            raise


def _run_ids(incomplete: str) -> list[str]:
    """Shell completion of RUN: the run dirs' names (a directory listing, no record read)."""
    from launcher.records.index import run_ids
    from launcher.records.store import default_home

    return run_ids(default_home() / "runs", incomplete)


class _RunsCommand(_Command):
    """A command whose RUN comes from its extra arguments (``status``): completes run ids too."""

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        from typer._click.shell_completion import CompletionItem  # typer's own click

        found = [] if incomplete.startswith("-") or ctx.args else [CompletionItem(r) for r in _run_ids(incomplete)]
        return found + list(super().shell_complete(ctx, incomplete))


app = typer.Typer(
    name="tfl", no_args_is_help=True, add_completion=True, rich_markup_mode=None, cls=_Group,
    help="Launch, supervise and inspect TensorFlow multi-worker training runs.\n\n"
         "First: `tfl launch jobs/mnist.py --local 2` trains on a chief and a worker here (a job's own options go after "
         "`--`); then, from any terminal, `tfl status`, `tfl logs`, `tfl stop`. A cluster of hosts: `tfl validate FILE`, "
         "`tfl doctor --cluster FILE`, `tfl launch JOB --cluster FILE`. Every command: `tfl COMMAND --help`.",
    pretty_exceptions_enable=False,
)
T = TypeVar("T")


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"{ERROR_PREFIX}{message}", err=True)
    return typer.Exit(code)


def _core(call: Callable[[], T]) -> T:
    """Run one call into the core; the launcher's own faults become one line on stderr."""
    try:
        return call()
    except TflError as exc:
        raise _fail(str(exc), exc.exit_code) from None


def _colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _store() -> Any:
    from launcher.records.store import RunStore

    return RunStore()
