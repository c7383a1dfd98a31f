"""The ``backchannel`` command. What a runtime starts takes a lean path that skips the
CLI framework: ``backchannel hook ...``, run around every turn and tool call
(:mod:`.hook_command`), and ``backchannel mcp``, which must answer the handshake before
the runtime gives up on it (:mod:`.mcp_front`). Everything else is the full CLI
(:mod:`.cli`).

Ctrl-C ends any of them with exit status 130 and no traceback, whenever it comes: while
the CLI is still being imported, while the hook or the MCP server reads its stdin, or
during a long-poll (which the full CLI also answers with 130)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        _main()
    except KeyboardInterrupt:
        # what a shell reports for a command stopped by SIGINT; a traceback would say
        # the command broke, when it was only stopped
        sys.stderr.flush()
        raise SystemExit(130) from None


def _main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["hook"]:
        from backchannel.interfaces import hook_command

        if hook_command.run(argv[1:]):
            return
    elif argv[:1] == ["mcp"]:
        from backchannel.interfaces import mcp_front

        if mcp_front.run(argv[1:]):
            return
    from backchannel.interfaces.cli import main as full_cli

    full_cli()


if __name__ == "__main__":
    main()
