"""The ``paddle-ipu`` command's entry point.

``paddle-ipu``, ``paddle-ipu --version`` and every ``--help`` (of the command or of a
subcommand) answer without importing Paddle, which takes about two seconds: the parser
is read from ``paddle_ipu/cli.py`` (which imports nothing but the standard library at
its top) and the version from ``paddle_ipu/_version.py``, without running the
``paddle_ipu`` package.  Every other command runs in ``paddle_ipu.cli``.  Installed at
the root of site-packages, beside the import hook.
"""

import importlib.util
import os
import sys


def _load(name):
    """paddle_ipu/NAME.py as a module of its own (the package is not imported)."""
    spec = importlib.util.find_spec("paddle_ipu")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), name + ".py")
    module_spec = importlib.util.spec_from_file_location("_paddle_ipu_cli_" + name, path)
    if module_spec is None or module_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _answer_without_paddle(args):
    """The exit code when the request is the usage text or the version, else None."""
    # cli.py's parser takes the shape flags from paddle_ipu/cli_shapes.py (standard
    # library only at its top): read it by path too, for the parser only
    shapes = _load("cli_shapes")
    if shapes is not None:
        sys.modules["paddle_ipu.cli_shapes"] = shapes
    try:
        return _parse_without_paddle(args)
    finally:
        if shapes is not None and sys.modules.get("paddle_ipu.cli_shapes") is shapes:
            del sys.modules["paddle_ipu.cli_shapes"]


def _parse_without_paddle(args):
    cli = _load("cli")
    if cli is None:
        return None
    if args == ["--version"]:
        print(f"paddle-ipu {_load('_version').__version__}")
        return 0
    parser = cli.build_parser()
    if not args:
        parser.print_help()
        return 0
    parser.parse_args(args)  # --help prints the usage and exits; so does a usage error
    return None


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args == ["--version"] or "-h" in args or "--help" in args:
        code = _answer_without_paddle(args)
        if code is not None:
            return code
    from paddle_ipu.cli import main as run

    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
