"""What README.md and docs/*.md say of the command line is what it has: every `tfl COMMAND …`
written in code (a code span or a fenced block) names a command, and every option after it is
one of that command's; every option's --help says its default, or is on a short list that
says why it need not.

The checker is tested on a page made to fail, so a pass over the real pages means something.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import typer.main

from launcher.cli import app
from tests.test_docs_links import ROOT, doc_pages

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_MENTION = re.compile(r"(?<![\w/.-])tfl ((?:export )?[a-z][\w-]*)")
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_END = re.compile(r" -- |(?<!\\)\||;|&&")  # the job's own arguments, a shell pipe or a table cell, the next command


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


COMMANDS = dict(_commands(typer.main.get_command(app)))


def _options(command: Any) -> set[str]:
    return {"--help", *(o for p in command.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())))}


def code_texts(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every fenced line and every inline code span outside the fences."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
        elif fence is not None:
            yield number, line
        else:
            yield from ((number, span.group(2)) for span in _CODE_SPAN.finditer(line))


def unknown_options(root: Path, pages: list[Path], commands: dict[str, set[str]]) -> list[str]:
    """One line per `tfl COMMAND` that is no command, and per option that command does not have."""
    return [problem for page in pages
            for problem in unknown_in(page.read_text(encoding="utf-8"), str(page.relative_to(root)), commands)]


def unknown_in(text: str, name_of_text: str, commands: dict[str, set[str]]) -> list[str]:
    """unknown_options of one text, its lines named `name_of_text:N`."""
    problems: list[str] = []
    for number, code in code_texts(text):
        mentions = list(_MENTION.finditer(code))
        for i, mention in enumerate(mentions):
            where, name = f"{name_of_text}:{number}", mention.group(1)
            if name not in commands and name.split()[0] not in commands:
                problems.append(f"{where}: `tfl {name}`: no such command")
                continue
            rest = code[mention.end():mentions[i + 1].start() if i + 1 < len(mentions) else len(code)]
            rest = _END.split(rest, maxsplit=1)[0]
            problems += [f"{where}: `tfl {name}` has no option {option}"
                         for option in _OPTION.findall(rest) if option not in commands.get(name, set())]
    return problems


def test_every_tfl_option_the_docs_name_exists() -> None:
    pages = doc_pages(ROOT)
    commands = {name: _options(command) for name, command in COMMANDS.items()}
    assert unknown_options(ROOT, pages, commands) == []
    # The docs name tfl launch in code dozens of times: a checker that found none would pass for nothing.
    assert sum(len(_MENTION.findall(code)) for page in pages for _, code in code_texts(page.read_text(encoding="utf-8"))) > 100


def test_unknown_commands_and_options_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("\n".join([
        "Run `tfl launch JOB --local 2 --evaluator -- --epochs 3` (the job's own after `--`).",  # fine
        "| `tfl launch … --min-tasks N [--global-batch G \\| --elastic-batch per-replica]` | a cell |",  # fine: \\| in a cell
        "Then `tfl launch JOB --local 2 --restarts 3` and `tfl stauts` and tfl launch --prose-only.",
        "```console",
        "$ tfl status RUN --json | grep -v --count x",  # fine: grep's own options
        "$ tfl logs RUN --task chief:0 --lines 5; tfl stop --force",
        "```",
        "`tfl export k8s JOB --image I --replicas 2`",
    ]), encoding="utf-8")
    commands = {"launch": {"--local", "--evaluator", "--min-tasks", "--global-batch", "--elastic-batch"},
                "status": {"--json"}, "logs": {"--task"}, "stop": set(), "export k8s": {"--image"}}
    assert unknown_options(tmp_path, doc_pages(tmp_path), commands) == [
        "README.md:3: `tfl launch` has no option --restarts",
        "README.md:3: `tfl stauts`: no such command",
        "README.md:6: `tfl logs` has no option --lines",
        "README.md:6: `tfl stop` has no option --force",
        "README.md:8: `tfl export k8s` has no option --replicas",
    ]


def test_tfl_help_says_what_to_run_first_with_real_options() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # the help is wrapped: a code span may cross a line
    assert "First: `tfl launch jobs/mnist.py --local 2`" in text
    commands = {name: _options(command) for name, command in COMMANDS.items()}
    assert unknown_in(text, "tfl --help", commands) == []
    assert len(_MENTION.findall(text)) >= 5


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
