"""The other way round from test_docs_cli: every option a command has is on its docs page.

README.md sends a user to docs/commands.md for "every option"; `tfl launch --network`,
`--virtual-devices`, `tfl doctor --accept-new-host-keys` and `tfl resume --verbose` were not
there. A command's option counts as named when a line of the page that names `tfl COMMAND`
in code also names the option (one of its spellings); `tfl export k8s`'s options are on
docs/kubernetes.md, anywhere in its code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.test_docs_cli import COMMANDS, code_texts
from tests.test_docs_links import ROOT

PAGES = {"export k8s": "docs/kubernetes.md"}  # else docs/commands.md


def _spellings(command: Any) -> list[tuple[str, ...]]:
    """Each visible option's spellings (``("--tail", "-n")``), --help left out."""
    return [tuple(p.opts) + tuple(getattr(p, "secondary_opts", ())) for p in command.params
            if getattr(p, "param_type_name", "") == "option" and not getattr(p, "hidden", False)
            and "--help" not in p.opts]


def _named(option: tuple[str, ...], code: str) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", code) for o in option)


def unnamed_options(commands: dict[str, Any], pages: dict[str, str], default_page: str, root: Path = ROOT) -> list[str]:
    """``tfl COMMAND --option`` for each option its page does not name."""
    missing = []
    for name, command in commands.items():
        if getattr(command, "hidden", False) or name.startswith("_"):
            continue
        page = pages.get(name, default_page)
        by_line: dict[int, str] = {}  # each line's code (its spans, or a fenced line), as one text
        for number, code in code_texts((root / page).read_text(encoding="utf-8")):
            by_line[number] = f"{by_line.get(number, '')} {code}"
        lines = list(by_line.values())
        if page == default_page:  # the lines (table rows) about this command
            mention = re.compile(rf"(?<![\w/.-])tfl {re.escape(name)}(?![\w-])")
            lines = [line for line in lines if mention.search(line)]
        missing += [f"{page}: tfl {name} {option[0]}" for option in _spellings(command)
                    if not any(_named(option, line) for line in lines)]
    return missing


def test_every_option_of_every_command_is_on_its_page() -> None:
    assert unnamed_options(COMMANDS, PAGES, "docs/commands.md") == []


def test_the_checker_finds_an_option_the_page_leaves_out(tmp_path: Path) -> None:
    import typer
    import typer.main

    app = typer.Typer()

    @app.command()
    def launch(network: str = "auto", tail: int = typer.Option(0, "--tail", "-n"), secret_flag: bool = False) -> None:
        """Three options: the page names two on tfl launch's row, one by its short spelling."""

    @app.command()
    def logs(secret_flag: bool = False) -> None:
        """--secret-flag is on the page, but not as code on this command's row."""

    (tmp_path / "page.md").write_text("| `tfl launch … --network M` / `-n N` | what it does |\n"
                                      "| `tfl logs` | --secret-flag, but not in code |\n"
                                      "| `tfl status --secret-flag` | another command's row |\n", encoding="utf-8")
    commands = dict(typer.main.get_command(app).commands.items())  # type: ignore[attr-defined]
    assert unnamed_options(commands, {}, "page.md", root=tmp_path) == [
        "page.md: tfl launch --secret-flag", "page.md: tfl logs --secret-flag"]
