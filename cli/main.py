"""The ``satcore`` command line (SPEC section 8).

Each command lives in its own module; adding one is one ``main.add_command``
line.  Every failure the user can cause (bad usage, an invalid dump, a value
the core rejects) ends with ONE line on stderr and exit status 2, never a
traceback.
"""

from __future__ import annotations

import sys

import click

from satcore.dump import DumpError

from .inspect_dump import inspect
from .merge import merge
from .probe import probe
from .score import score
from .sweep import sweep

USAGE_OR_INPUT_ERROR = 2
# click >= 8.2 raises this for a bare group; older click prints the help itself (an empty tuple catches nothing)
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class SatcoreGroup(click.Group):
    """A click group whose errors are one line on stderr with exit status 2."""

    def main(self, args=None, prog_name=None, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            code = super().main(args=args, prog_name=prog_name or "satcore", **kwargs)
        except NO_ARGS_IS_HELP as exc:
            click.echo(exc.ctx.get_help(), err=True)  # bare ``satcore``: the help as written, not one line
            sys.exit(USAGE_OR_INPUT_ERROR)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _fail(f"{exc.format_message()}{hint}")
        except click.ClickException as exc:
            _fail(exc.format_message())
        except click.Abort:
            _fail("aborted")
        except (DumpError, ValueError, TypeError, OSError) as exc:
            _fail(str(exc) or type(exc).__name__)
        except MemoryError:
            _fail("out of memory")
        except (ArithmeticError, RecursionError) as exc:  # input values beyond float range or nesting limits
            _fail(f"{type(exc).__name__}: {exc}")
        sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str):
    one_line = " ".join(message.split())
    click.echo(f"satcore: error: {one_line}", err=True)
    sys.exit(USAGE_OR_INPUT_ERROR)


@click.group(cls=SatcoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="satcore")
def main():
    """First-order residual depth saturation: can adding a residual block still help, and where?"""


main.add_command(score)
main.add_command(inspect)
main.add_command(merge)
main.add_command(sweep)
main.add_command(probe)
