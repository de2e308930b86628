"""The ``satcore`` command line (docs/dump-format.md, Command line).

Each command lives in its own module; adding one is one ``main.add_command``
line.  Every failure the user can cause (bad usage, an invalid input file, a
value the core rejects, a file that cannot be written, memory running out)
ends with ONE line on stderr and exit status 2, never a traceback; names from
files in that line are escaped (printable, one line).  Any other exception is
a bug in satcore and shows as one, with its traceback.  ``satcore --debug``
prints the traceback of an expected error too, before its line.  A standard
output that is a closed pipe (``satcore score D | head``) is no error to
report: click ends the command silently with status 1.

NumPy's floating-point warnings are silenced: every non-finite result is
checked explicitly and refused with a message, so a RuntimeWarning would only
print noise ahead of that message.
"""

from __future__ import annotations

import sys
import traceback
import warnings

import click
import numpy as np

from satcore.adapter_api import command_inputs
from satcore.adapter_api import display_name, options_named_by
from satcore import SatcoreError

from .expand import expand
from .fetch_example import fetch_example
from .inspect_dump import inspect
from .merge import merge
from .probe import probe
from .score import score
from .sweep import sweep

USAGE_OR_INPUT_ERROR = 2
# click >= 8.2 raises this for a bare group; older click prints the help itself (an empty tuple catches nothing)
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


# Input, usage and environment errors: SatcoreError is every refusal satcore makes on purpose (invalid
# input, dumps, probes: satcore._shared.errors); OSError covers files that cannot be read or written.  Any other
# exception, a bare ValueError included, is a bug and shows its traceback.
EXPECTED_ERRORS = (SatcoreError, OSError)


class SatcoreGroup(click.Group):
    """A click group whose expected errors are one line on stderr with exit status 2."""

    debug = False  # set by --debug

    def main(self, args=None, prog_name=None, **kwargs):
        kwargs["standalone_mode"] = False
        SatcoreGroup.debug = False
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=RuntimeWarning, module="numpy")
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
        except EXPECTED_ERRORS as exc:
            _fail(_message(exc))
        except MemoryError:
            _fail("out of memory")
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        # every file the command reads is an input that none of its outputs may replace; a refusal of a value the
        # user gave names it by the flag typed (--n-features), not by the Python keyword it is passed on as
        with command_inputs(), options_named_by(_flag_of):
            return super().invoke(ctx)


def _flag_of(keyword: str) -> str | None:
    """The running command's flag for the Python keyword ``keyword`` (its option of that name, by its long
    spelling), None where the command has no such option."""
    ctx = click.get_current_context(silent=True)
    options = [p for p in (ctx.command.params if ctx else ()) if isinstance(p, click.Option) and p.name == keyword]
    return max(options[0].opts, key=len) if options else None


def _message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in text:
        text = f"{exc.filename}: {exc.strerror or text}"  # name the file (e.g. '[Errno 27] File too large')
    elif isinstance(exc, OSError) and exc.filename is None and (stream := _echo_stream(exc)) is not None:
        text = f"{stream}: {exc.strerror or text}"  # 'satcore score D > /dev/full': a write with no file name
    return text


def _echo_stream(exc: BaseException) -> str | None:
    """The stream a failed ``click.echo`` wrote to, read off ``exc``'s traceback (None: not raised by echo).

    Every command writes through ``click.echo``, whose public ``err`` argument picks the stream; the traceback
    already holds echo's frame, so this reads the one fact the OSError lacks where it is.  (A write error has no
    ``__context__`` naming a stream, and a stream's state after ENOSPC or EIO says nothing: it is not closed.)
    """
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is click.utils.echo.__code__:
            return "standard error" if tb.tb_frame.f_locals.get("err") else "standard output"
        tb = tb.tb_next
    return None


def _fail(message: str):
    if SatcoreGroup.debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    one_line = display_name(" ".join(message.split()), limit=2000)
    click.echo(f"satcore: error: {one_line}", err=True)
    sys.exit(USAGE_OR_INPUT_ERROR)


def _set_debug(ctx, param, value):
    SatcoreGroup.debug = SatcoreGroup.debug or bool(value)
    return value


@click.group(cls=SatcoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, is_eager=True, expose_value=False, callback=_set_debug,
              help="On an error, also print its traceback (to report a problem).")
@click.version_option(package_name="satcore")
def main():
    """First-order residual depth saturation: can adding a residual block still help, and where?"""


main.add_command(score)
main.add_command(inspect)
main.add_command(merge)
main.add_command(sweep)
main.add_command(probe)
main.add_command(expand)
main.add_command(fetch_example)


if __name__ == "__main__":  # `python -m satcore.cli.main`: the console script without an install
    main()
