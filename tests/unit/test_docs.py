"""README.md and docs/*.md say what the code does: their examples run and their option tables are the parser's.

What is checked, per fenced block (the marker is an HTML comment on the line right before a block):

- ```python, no marker: executed as written, in a fresh namespace, with the repository root as the
  working directory (examples that read results read the committed results/reference/). A plain ```
  block right after it is what it prints, and must be.
- ```python after `<!-- doc-test: module NAME.py -->`: written to a temporary directory as NAME.py and
  imported. A module with a `factory` is loaded as `--workload NAME:factory` and put through the checks
  `distbench run` makes before any process group starts; a `run with: COMMAND` in its first comment line
  is checked as a shell command.
- ```python after `<!-- doc-test: skip (REASON) -->`: not run (for an example that needs a finished long run).
- ```bash / ```sh: every command is split with shlex (a syntax error fails) and, without running anything,
  `distbench ARGS`, `python -m benchmarks.cli ARGS` and the `-m benchmarks.cli ARGS` tail of a torchrun,
  horovodrun, mpirun, srun or `docker run … distbench ARGS` line are parsed by `benchmarks.cli.build_parser()`
  (sub-command, exact option names, values); `make X` must name a Makefile target, `python -m X` an
  importable module, a `docker/…` script an existing file. Inline code spans holding such a command get the
  same checks, less the full parse (prose quotes fragments such as `distbench run`).
- ```toml: a `distbench tune --grid` file, loaded by `tune.load_grid`.
- a plain ``` block (output) whose paragraph names a `results/reference/…` file: every line it shows is a
  line of that file (`…` marks lines left out); right after a ```bash block that is one `distbench check`:
  what that check prints, run in-process on the committed references.

And: the option tables of `distbench run` and `distbench allreduce` in docs/commands.md are
`python -m backends`'s output, verbatim; every `| option | default | meaning |` table names
options of the command of its section, with the parser's numeric defaults; commands.md mentions every
option of every command; relative links and their #anchors resolve; README keeps `make demo` and
`make test` in its first block and stays a front page.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import backends
from benchmarks import cli, config

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS, REPO / "results" / "README.md"]
MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<kind>module|skip)\b\s*(?P<arg>.*?)\s*-->")
PROGRAMS = {"distbench", "make", "python", "torchrun", "horovodrun", "mpirun", "srun", "docker", "source", "pip"}
LAUNCHERS = {"torchrun", "horovodrun", "mpirun", "srun"}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: re.Match[str] | None
    end: int = 0  # 1-based line of the closing fence
    output: str | None = None  # a plain ``` block right after a ```python one: what it prints

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line} (```{self.lang} block)"


def blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, fence.group(1), text, MARKER.search(before), end + 1))
        i = end + 1
    for code, shown in zip(found, found[1:], strict=False):
        if code.lang == "python" and shown.lang == "" and not "".join(lines[code.end : shown.line - 1]).strip():
            code.output = shown.text
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


def prose(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced blocks."""
    out, inside = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            out.append((number, line))
    return out


def test_blocks_are_found_and_markers_known() -> None:
    langs = {b.lang for b in ALL_BLOCKS}
    assert {"python", "bash"} <= langs, langs
    for page in PAGES:
        for number, line in prose(page):
            if "doc-test" in line:
                assert MARKER.search(line), f"{page.relative_to(REPO)}:{number}: unknown doc-test marker {line!r}"
    for b in ALL_BLOCKS:
        assert b.marker is None or b.lang == "python", f"{b}: doc-test markers apply to ```python blocks only"
        if b.marker and b.marker["kind"] == "skip":
            assert b.marker["arg"].strip("() "), f"{b}: `doc-test: skip` needs a reason in parentheses"
        assert b.lang in {"", "python", "bash", "sh", "toml"}, f"{b}: no check for ```{b.lang} blocks; add one"


# ---------------------------------------------------------------- option tables


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUB = subparsers()


def options_of(name: str) -> dict[str, argparse.Action]:
    """A command's options, its sub-commands' included (`distbench cluster up --hosts`)."""
    parsers = [SUB[name]]
    for action in SUB[name]._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += list(action.choices.values())
    return {s: a for p in parsers for s, a in p._option_string_actions.items() if s not in ("-h", "--help")}


@pytest.mark.parametrize("table", ["option_table", "allreduce_option_table"])
def test_generated_option_tables_are_the_dataclasses(table: str) -> None:
    """docs/commands.md holds `python -m backends`'s tables verbatim; paste them again after a change."""
    made = config.option_table(backends.NAMES) if table == "option_table" else config.allreduce_option_table()
    assert made in (REPO / "docs" / "commands.md").read_text(), (
        f"docs/commands.md: a table differs from benchmarks.config.{table}() (`python -m backends` prints it); "
        "replace the table with that output"
    )


def test_the_launcher_table_has_a_row_for_every_declared_backend() -> None:
    page = (REPO / "docs" / "commands.md").read_text()
    table = page.split("Which launchers each backend accepts")[1].split("\n\n")[1]
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]}
    assert rows == set(backends.NAMES), f"docs/commands.md's launcher table: {rows} vs the declared {backends.NAMES}"


def option_tables(page: Path) -> list[tuple[int, str | None, list[list[str]]]]:
    """(line, command of the enclosing `distbench X` heading, rows) of every `| option | … |` table."""
    found, command, rows, start = [], None, None, 0
    for number, line in prose(page) + [(0, "")]:
        heading = re.match(r"^#+ .*?`distbench (\w+)", line)
        if heading:
            command = heading.group(1)
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if rows is not None and cells is None:
            found.append((start, command, rows))
            rows = None
        if cells and cells[0] == "option" and rows is None:
            rows, start = [], number
        elif cells and rows is not None and not set(cells[0]) <= set("-:"):
            rows.append(cells)
    return found


TABLES = [(page, *t) for page in PAGES for t in option_tables(page)]


def test_option_tables_name_real_options_with_the_parsers_defaults() -> None:
    assert len(TABLES) >= 5, TABLES
    for page, line, command, rows in TABLES:
        where = f"{page.relative_to(REPO)}:{line}"
        assert command in SUB, f"{where}: an option table outside a `distbench COMMAND` section"
        known = options_of(command)
        for cells in rows:
            flags = re.findall(r"`(--[\w-]+)`", cells[0])
            if not flags:
                assert cells[0].startswith(("**", "`PATH")), f"{where}: row {cells[0]!r} names no `--option`"
                continue
            for flag in flags:
                assert flag in known, f"{where}: `distbench {command}` has no option {flag}"
            default = cells[1].strip("`") if len(cells) > 1 else ""
            action = known[flags[0]]
            if re.fullmatch(r"-?\d+(\.\d+)?", default) and isinstance(action.default, (int, float, str)):
                try:
                    actual = float(action.default)
                except ValueError:
                    actual = None
                assert actual == float(default), (
                    f"{where}: `distbench {command} {flags[0]}` defaults to {action.default!r}, the table: {default}"
                )


def test_commands_page_names_every_option_of_every_command() -> None:
    text = (REPO / "docs" / "commands.md").read_text()
    for name in SUB:
        assert f"`distbench {name}`" in text, f"docs/commands.md does not describe `distbench {name}`"
        for flag, action in options_of(name).items():
            if action.help != argparse.SUPPRESS and flag.startswith("--"):
                assert f"`{flag}`" in text, f"docs/commands.md does not describe `distbench {name} {flag}`"


# ---------------------------------------------------------------- shell commands


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M)}


MAKE_TARGETS = makefile_targets()


def commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank and comment lines left out."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def cli_args(tokens: list[str]) -> list[str] | None:
    """The arguments `benchmarks.cli` gets from this command line, or None when it starts no distbench."""
    for i, token in enumerate(tokens):
        if token == "-m" and tokens[i + 1 : i + 2] == ["benchmarks.cli"]:
            return tokens[i + 2 :]
        if Path(token).name == "distbench":
            return tokens[i + 1 :]
    return None


def check_cli(args: list[str], full: bool) -> str | None:
    """What is wrong with `distbench ARGS`, or None. `full`: parse them all as the command would."""
    if not args and not full:
        return None  # prose naming the entry point, e.g. `python -m benchmarks.cli`
    if not args or args[0] not in SUB:
        return f"unknown sub-command {args[:1]}; known: {', '.join(SUB)}"
    known = options_of(args[0])
    for token in args[1:]:
        if token == "--":  # what follows is a command for distbench to run (`distbench cluster exec h0 -- …`)
            break
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            return f"`distbench {args[0]}` has no option {flag}"
    if full:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.build_parser().parse_args(args)
            except SystemExit as exc:
                if exc.code:
                    return err.getvalue().strip().splitlines()[-1]
    return None


def check_command(line: str, full: bool = True) -> str | None:
    """What is wrong with one shell command of the docs, or None; nothing is executed."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        return f"shell syntax: {exc}"
    tokens = [t for t in tokens if t != "$@"]  # a script passing its own arguments on
    if not tokens:
        return None
    program = Path(tokens[0]).name
    args = cli_args(tokens)
    if args is not None:
        return check_cli(args, full)
    if program == "make":
        targets = [t for t in tokens[1:] if "=" not in t and not t.startswith("-")]
        missing = [t for t in targets if t not in MAKE_TARGETS]
        return f"no Makefile target {', '.join(missing)}" if missing else None
    if program.startswith("python") and "-m" in tokens:
        module = tokens[tokens.index("-m") + 1]
        return None if importlib.util.find_spec(module) else f"no module {module}"
    if program in LAUNCHERS:
        return f"a {program} line that starts no `-m benchmarks.cli`"
    if "/" in tokens[0] and not tokens[0].startswith(".venv/"):
        return None if (REPO / tokens[0]).is_file() else f"no file {tokens[0]}"
    if program not in PROGRAMS:
        return f"unknown program {program!r}: add a check for it to tests/unit/test_docs.py"
    return None


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in ("bash", "sh")], ids=str)
def test_shell_commands_name_real_commands_and_options(block: Block) -> None:
    problems = [f"{line}\n    {p}" for line in commands(block.text) if (p := check_command(line))]
    assert not problems, f"{block}:\n  " + "\n  ".join(problems)


def paragraphs(page: Path) -> list[tuple[int, str]]:
    """(first line, text on one line) of each paragraph outside fenced blocks: inline code may wrap."""
    out: list[tuple[int, str]] = []
    previous = -1
    for number, line in prose(page):
        if line.strip() and number == previous + 1 and out and not line.lstrip().startswith(("|", "#")):
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
        elif line.strip():
            out.append((number, line.strip()))
        previous = number if line.strip() else -1
    return out


INLINE_COMMAND = r"(\.venv/bin/)?(distbench [a-z]|python -m [a-z])|make [a-z]|docker/[\w-]+\.sh"


def test_inline_commands_name_real_commands_and_options() -> None:
    problems, seen = [], 0
    for page in PAGES:
        for number, text in paragraphs(page):
            for span in re.findall(r"`([^`]+)`", text):
                if re.match(INLINE_COMMAND, span) or "-m benchmarks.cli " in span:
                    seen += 1
                    if problem := check_command(span, full=False):
                        problems.append(f"{page.relative_to(REPO)}:{number}: `{span}`: {problem}")
    assert seen > 20, seen
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_it_should() -> None:
    assert check_command(".venv/bin/distbench compare --nproc 1,2,4") is None
    assert check_command("torchrun --nproc-per-node 2 -m benchmarks.cli run --backend ddp") is None
    assert "no option --nprocs" in check_command("distbench compare --nprocs 2")
    assert "unknown sub-command" in check_command("distbench comapre")
    assert check_command("distbench run --workload mlp")  # --backend is required
    assert check_command("distbench run --backend ddp --epochs two")
    assert "no Makefile target" in check_command("make tests")
    assert "shell syntax" in check_command("distbench report 'results/runs")
    assert "no module" in check_command("python -m benchmarks.nonesuch")


# ---------------------------------------------------------------- python and toml examples


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "python"], ids=str)
def test_python_examples_run(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    if block.marker is None:
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(block.text, str(block), "exec"), {"__name__": "__doc_test__"})
        except Exception as exc:
            pytest.fail(f"{block} does not run as written: {type(exc).__name__}: {exc}")
        if block.output is not None:  # the output shown under it is what it prints
            assert printed.getvalue().rstrip() == block.output.rstrip(), (
                f"{block}: prints\n{printed.getvalue()}\nbut the block under it shows\n{block.output}"
            )
        return
    if block.marker["kind"] == "skip":
        pytest.skip(f"{block}: {block.marker['arg']}")
    filename = block.marker["arg"]
    assert filename.endswith(".py"), f"{block}: `doc-test: module` needs a file name, e.g. mywork.py"
    name = filename[:-3]
    (tmp_path / filename).write_text(block.text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    first = block.text.splitlines()[0]
    if "run with:" in first:
        problem = check_command(first.split("run with:", 1)[1])
        assert problem is None, f"{block}: its `run with:` command: {problem}"
    try:
        module = importlib.import_module(name)
        if hasattr(module, "factory"):  # a workload: what `distbench run --workload NAME:factory` checks first
            from benchmarks.run import workloads
            from benchmarks.run.workloads import checks

            checks.check_workload(workloads.load(f"{name}:factory", seed=0), f"{name}:factory")
    except Exception as exc:
        pytest.fail(f"{block} ({filename}) does not work as written: {type(exc).__name__}: {exc}")
    finally:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "toml"], ids=str)
def test_toml_examples_are_grids(block: Block, tmp_path: Path) -> None:
    from benchmarks.suite import tune

    path = tmp_path / "grid.toml"
    path.write_text(block.text)
    grid = tune.load_grid(str(path))
    assert grid != tune.DEFAULT_GRID, f"{block}: the grid changes nothing"


def quoted_file(block: Block) -> Path | None:
    """The committed file a plain block says it is copied from: a `results/reference/…` file named in the
    prose since the previous heading or plain block."""
    earlier = [b.end for b in blocks(block.page) if b.lang == "" and b.end < block.line]
    text = [(n, line) for n, line in prose(block.page) if n < block.line]
    headings = [n for n, line in text if line.startswith("#")]
    since = max([0, *earlier, *headings])
    for _, line in reversed([(n, line) for n, line in text if n > since]):
        for path in re.findall(r"`(results/reference/[^`\s]+\.(?:txt|md|csv))`", line):
            if (REPO / path).is_file():
                return REPO / path
    return None


QUOTES = [b for b in ALL_BLOCKS if b.lang == "" and quoted_file(b)]


@pytest.mark.parametrize("block", QUOTES, ids=str)
def test_quoted_output_is_in_the_file_it_cites(block: Block) -> None:
    """Output shown as copied from a committed reference is in it, line for line (`…` marks rows left out)."""
    source = quoted_file(block)
    assert source is not None
    have = {line.rstrip() for line in source.read_text().splitlines()}
    missing = [line for line in block.text.splitlines() if line.strip() not in ("", "…") and line.rstrip() not in have]
    assert not missing, f"{block} quotes {source.relative_to(REPO)}, which has no line\n" + "\n".join(missing)


def check_outputs() -> list[tuple[Block, list[str]]]:
    """Plain blocks right after a ```bash block that is one `distbench check PATH…`: that command's output."""
    found = []
    for page in PAGES:
        page_blocks = blocks(page)
        for command, shown in zip(page_blocks, page_blocks[1:], strict=False):
            lines = commands(command.text) if command.lang == "bash" and shown.lang == "" else []
            args = cli_args(shlex.split(lines[0], comments=True)) if len(lines) == 1 else None
            if args and args[0] == "check":
                found.append((shown, args))
    return found


@pytest.mark.parametrize(("block", "args"), check_outputs(), ids=lambda x: str(x) if isinstance(x, Block) else "")
def test_check_output_shown_is_what_check_prints(block: Block, args: list[str], monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    assert cli.main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = [line for line in block.text.splitlines() if line.strip() not in ("", "…")]
    assert all(line in printed for line in shown) and shown[-1] == printed[-1], (
        f"{block}: `distbench {' '.join(args)}` prints\n" + "\n".join(printed)
    )


# ---------------------------------------------------------------- links and the front page


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, … as on GitHub."""
    found: set[str] = set()
    times: dict[str, int] = {}
    for _, line in prose(page):
        heading = re.match(r"^#+ (.*)", line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{times[base]}" if base in times else base)
            times[base] = times.get(base, 0) + 1
    return found


def test_links_and_anchors_resolve() -> None:
    problems = []
    for page in PAGES:
        for number, line in prose(page):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(REPO)}:{number}: ({target})"
                if not dest.exists():
                    problems.append(f"{where}: no such file")
                elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                    problems.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    assert not problems, "\n".join(problems)


def test_readme_is_a_front_page() -> None:
    readme = REPO / "README.md"
    first = next(b for b in blocks(readme) if b.lang == "bash")
    assert "make demo" in first.text and "make test" in first.text, "README's first block must give both commands"
    assert len(readme.read_text().splitlines()) <= 260, "README.md is the front page; move detail into docs/"
    text = readme.read_text()
    for command in SUB:
        assert f"**`distbench {command}`**" in text, f"README.md has no example of `distbench {command}`"
    for page in DOCS:
        assert f"docs/{page.name}" in text or page.name == "README.md", f"README.md does not link docs/{page.name}"
