"""The ``backchannel`` command. What a runtime starts takes a lean path that skips the
CLI framework: ``backchannel hook ...``, run around every turn and tool call
(:mod:`.hook_command`), and ``backchannel mcp``, which must answer the handshake before
the runtime gives up on it (:mod:`.mcp_front`). Everything else is the full CLI
(:mod:`.cli`)."""

from __future__ import annotations

import sys


def main() -> None:
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
