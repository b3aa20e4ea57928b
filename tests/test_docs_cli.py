"""Every option's --help says its default, or is on a short list that says why it need not."""

from __future__ import annotations

from typing import Any, Iterator

import typer.main

from launcher.cli import app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


COMMANDS = dict(_commands(typer.main.get_command(app)))


# Options whose --help need not say a default, and why. Any other option without a shown default
# says in its help what happens when it is not given.
UNSAID_DEFAULTS = {
    ("launch", "--cluster"), ("launch", "--local"),  # give exactly one of them (or --slurm): no default
    ("export k8s", "--cluster"), ("export k8s", "--local"),  # the same
    ("export k8s", "--image"),  # required, its help says so
    ("launch", "--sync"),  # repeatable: each one adds a directory
    ("resume", "--max-restarts"), ("resume", "--max-preemptions"), ("resume", "--grace-period"),  # "instead of the run's own"
    ("logs", "--task"), ("logs", "--tail"),  # "only ...": without it, every task, every line
    ("export k8s", "--output"),  # "instead of printing it"
}


def test_every_option_says_its_default() -> None:
    unsaid = {(name, param.opts[0]) for name, command in COMMANDS.items() for param in command.params
              if param.param_type_name == "option" and not param.is_flag and not param.required and not param.hidden
              and not (param.show_default and param.default not in (None, [], ())) and "default" not in (param.help or "")}
    assert unsaid == UNSAID_DEFAULTS
