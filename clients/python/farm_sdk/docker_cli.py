"""`farm-docker`: the few `docker` commands agent harnesses run to hold a container, answered
with farm sandboxes, so a harness that shells out to docker runs on farm as it ships by
naming this program as its docker (mini-swe-agent's `executable: farm-docker`, or
`MSWEA_DOCKER_EXECUTABLE=farm-docker`, which `mini-extra swebench` uses for each instance's
own image).

    farm-docker run -d [--name N] [-w DIR] [-e K=V]... [--rm] IMAGE [sleep DURATION]
                                     a sandbox of IMAGE's environment; prints its id
    farm-docker exec [-i] [-w DIR] [-e K=V]... [-u USER] ID COMMAND...
                                     runs COMMAND in it: its output, its exit status
    farm-docker stop|kill ID...      removes it (so does `rm -f ID...`)

IMAGE is a farm environment's id (`env-...`), a built-in or registry image (`python`,
`ghcr.io/o/i:tag`), or `dockerfile:PATH` (a Dockerfile, or a folder with one: its folder is
the build context); its environment is built on first use and found by content after.
`sleep DURATION` (`2h`, `30m`, `600`) is the sandbox's lifetime. The service is `$FARM_URL`
with the key `$FARM_SERVE_TOKEN`. Anything else is refused, saying what is served.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Tuple

from .client import Farm, Sandbox
from .errors import FarmError

_SUFFIXES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def environment_of(farm: Farm, image: str) -> str:
    """The farm environment an image names (see the module's documentation): built on first
    use, found by content after."""
    if image.startswith("env-"):
        return image
    if image.startswith("dockerfile:"):
        path = os.path.abspath(image[len("dockerfile:"):])
        folder, name = (path, "Dockerfile") if os.path.isdir(path) else (os.path.dirname(path), os.path.basename(path))
        return farm.environments.from_dockerfile(folder, name).id
    return farm.environments.create(image).id


def _seconds(duration: str) -> Optional[int]:
    unit = duration[-1:] if duration[-1:] in _SUFFIXES else "s"
    number = duration[:-1] if duration[-1:] in _SUFFIXES else duration
    try:
        return max(1, int(float(number) * _SUFFIXES[unit]))
    except ValueError:
        return None


def _options(args: List[str], flags: Dict[str, str], switches: Tuple[str, ...]) -> Tuple[Dict[str, List[str]], List[str]]:
    """Leading options: those in `flags` take a value (`-w DIR`, `--workdir=DIR`), `switches`
    none; the rest of the arguments after them."""
    seen: Dict[str, List[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, _, inline = arg.partition("=")
        if name in flags:
            if not inline:
                i += 1
                if i >= len(args):
                    raise SystemExit(f"farm-docker: {name} needs a value")
                inline = args[i]
            seen.setdefault(flags[name], []).append(inline)
        elif arg not in switches:
            raise SystemExit(f"farm-docker: option {arg} is not served (see farm-docker --help)")
        i += 1
    return seen, args[i:]


def _variables(pairs: List[str]) -> Dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        env[key] = value if sep else os.environ.get(key, "")
    return env


def run(farm: Farm, args: List[str]) -> int:
    flags = {"--name": "name", "-w": "workdir", "--workdir": "workdir", "-e": "env", "--env": "env",
             "-u": "user", "--user": "user"}
    seen, rest = _options(args, flags, ("-d", "--detach", "--rm", "-i", "-t", "-it"))
    if not rest:
        raise SystemExit("farm-docker run: no image")
    image, command = rest[0], rest[1:]
    lifetime = _seconds(command[1]) if len(command) == 2 and command[0] == "sleep" else None
    workdir = (seen.get("workdir") or [None])[-1]
    metadata = {"farm-docker": (seen.get("name") or ["-"])[-1][:200]}
    sandbox = farm.sandboxes.create(
        environment_of(farm, image), env=_variables(seen.get("env", [])) or None, workdir=workdir,
        user=(seen.get("user") or [None])[-1], lifetime_secs=lifetime, metadata=metadata,
    )
    if workdir:
        made = sandbox.exec(["mkdir", "-p", "--", workdir], cwd="/")
        if not made.ok:
            sandbox.kill()
            raise SystemExit(f"farm-docker run: cannot make {workdir}: {made.stderr.strip()}")
    print(sandbox.id)
    return 0


def execute(farm: Farm, args: List[str]) -> int:
    flags = {"-w": "workdir", "--workdir": "workdir", "-e": "env", "--env": "env", "-u": "user", "--user": "user"}
    seen, rest = _options(args, flags, ("-i", "-t", "-it", "--interactive"))
    if len(rest) < 2:
        raise SystemExit("farm-docker exec: ID COMMAND... expected")
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    result = Sandbox(farm, rest[0]).exec(
        rest[1:], cwd=(seen.get("workdir") or [None])[-1], env=_variables(seen.get("env", [])) or None,
        user=(seen.get("user") or [None])[-1], stdin=stdin or None, max_output_bytes=16 << 20,
    )
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.exit_code is not None:
        return result.exit_code
    return 128 + result.signal if isinstance(result.signal, int) else 137


def remove(farm: Farm, args: List[str]) -> int:
    _, ids = _options(args, {"-t": "time", "--time": "time"}, ("-f", "--force"))
    for sandbox_id in ids:
        Sandbox(farm, sandbox_id).kill()
        print(sandbox_id)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    commands = {"run": run, "exec": execute, "stop": remove, "kill": remove, "rm": remove}
    if args[0] not in commands:
        print(f"farm-docker: `{args[0]}` is not served: only {', '.join(commands)} (see --help)", file=sys.stderr)
        return 2
    try:
        with Farm() as farm:
            return commands[args[0]](farm, args[1:])
    except FarmError as e:
        print(f"farm-docker {args[0]}: {e}", file=sys.stderr)
        return 125


if __name__ == "__main__":
    sys.exit(main())
