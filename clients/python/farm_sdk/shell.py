"""A terminal on a sandbox, in this one: `python3 -m farm_sdk.shell SANDBOX_ID [--user USER]`
(the command inspect_ai's `connection()` gives for a farm sandbox). The service is
`$FARM_URL` with the key `$FARM_SERVE_TOKEN`. Needs `farm-sdk[pty]` (websockets) and a
terminal; the shell's exit ends it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading

from .client import Farm, Sandbox
from .errors import WaitTimeout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m farm_sdk.shell", description=__doc__.split("\n")[0])
    parser.add_argument("sandbox", help="the sandbox's id (sb-...)")
    parser.add_argument("--user", help="the guest user the shell runs as (default the sandbox's)")
    args = parser.parse_args(argv)
    import termios
    import tty

    size = shutil.get_terminal_size()
    with Farm() as farm:
        terminal = Sandbox(farm, args.sandbox).pty(rows=size.lines, cols=size.columns, user=args.user)
        saved = termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
        if saved is not None:
            tty.setraw(sys.stdin.fileno())

        def typing() -> None:
            while True:
                data = os.read(sys.stdin.fileno(), 1024)
                if not data:
                    return
                terminal.send(data)

        threading.Thread(target=typing, daemon=True).start()
        try:
            while True:
                try:
                    out = terminal.recv(timeout=3600)
                except WaitTimeout:
                    continue
                if not out:
                    break
                os.write(sys.stdout.fileno(), out)
        finally:
            if saved is not None:
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
            terminal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
