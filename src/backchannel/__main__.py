"""``python -m backchannel``: the ``backchannel`` command."""

from backchannel.interfaces.launcher import main

main()
