"""What every ``tidemark`` command line shares, the CLI's and the jobs' alike: the
help layout with its examples, the one error form and exit codes, and the number
argument types."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence

from spark_jobs.config import ConfigError

# Exit codes: a bad command line or pipeline file (argparse's own code for a bad
# command line), and a failure while running.
BAD_INPUT = 2
FAILED = 1
# The jobs that are streams (common.job_parser's): continuous unless told otherwise.
STREAM_JOBS = ("bronze", "silver", "gold", "offline", "run")
TRIGGERS = ("continuous", "available-now")
# The shipped demo pipeline the help's examples use (by path or by its name, telemetry).
EXAMPLE_PIPELINE = "spark_jobs/pipelines/telemetry.yaml"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The layout of every ``tidemark`` help: the description and the example block
    keep their lines (an indented line, such as a command, is never wrapped), and an
    option shows its default when it has one of its own. An option whose default is
    worked out at run time (``None``) or an unset flag shows none: its help says it."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            if line.startswith(" ") or len(indent + line) <= width:
                lines.append(indent + line)
            else:
                lines.append(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent))
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unshown = default is None or default is argparse.SUPPRESS or isinstance(default, bool)
        if unshown or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)".lstrip()


def with_examples(parser: argparse.ArgumentParser, *commands: str) -> argparse.ArgumentParser:
    """Give ``parser`` the help layout of every ``tidemark`` command (:class:`HelpFormatter`)
    and end its help with ``commands`` as examples."""
    parser.formatter_class = HelpFormatter
    parser.epilog = "example:\n" + "\n".join(f"  {command}" for command in commands)
    return parser


def print_error(command: str | None, message: str) -> None:
    """Report an error the one way every ``tidemark`` command does, which is also how
    argparse reports a bad command line: ``tidemark <command>: error: <message>``."""
    prog = f"tidemark {command}" if command else "tidemark"
    print(f"{prog}: error: {message}", file=sys.stderr)


def config_error_message(error: ConfigError) -> str:
    """A bad argument names itself (``--interval: ...``); a bad pipeline file is called one."""
    return str(error) if error.field.startswith("--") else f"invalid pipeline: {error}"


def _number(kind: type, accepts: Callable[[float], bool], expected: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value != value or not accepts(value):  # value != value: NaN
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


positive_int = _number(int, lambda value: value > 0, "a whole number above 0")
non_negative_int = _number(int, lambda value: value >= 0, "a whole number, 0 or more")
positive_float = _number(float, lambda value: 0 < value < float("inf"), "a finite number above 0")
share = _number(float, lambda value: 0 <= value <= 1, "a share between 0 and 1")
port = _number(int, lambda value: 1 <= value <= 65535, "a TCP port between 1 and 65535")


def stream_trigger(job: str, job_args: Sequence[str]) -> str | None:
    """The trigger a stream job's command line asks for (its parser's default when it
    names none); None for a job that is no stream. The job's own parser checks the value."""
    if job not in STREAM_JOBS:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--trigger", default=TRIGGERS[0])
    return parser.parse_known_args(list(job_args))[0].trigger
