"""Writes hostile-shared-scoring-tasks.jsonl and hostile-shared-scoring-samples.jsonl: rollouts
that try to pass a check through state an earlier rollout's check left in a shared scoring VM
(`[scoring] isolation = "sandbox"`, configs/hostile-shared-scoring.toml).

One task, `farm/leak`: the tests pass when `leak()` returns True. Planters (samples 0 and 3)
leave state everywhere an unprivileged process can, check that they see it themselves, say
what they left on standard error and return False. Seekers (the other samples) return True
when any of it is still there. With one scoring VM serving every check in turn, a seeker that
passes is state that crossed from one rollout's check to another's.

    python3 configs/data/hostile-shared-scoring.py
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

PROMPT = 'def leak() -> bool:\n    """True when another check left something behind."""\n'
TEST = "def check(candidate):\n    assert candidate() is True\n"

COMMON = r'''
    import ctypes, os, socket, sys, time
    KEY = 0x4641524D
    PATHS = ["/tmp/farm-leak", "/var/tmp/farm-leak", "/dev/shm/farm-leak", "/workspace/farm-leak",
             "/home/farm/farm-leak", "/run/lock/farm-leak", os.path.join(os.getcwd(), "farm-leak-cwd")]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.restype = ctypes.c_int
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]

    def seen():
        found = [p for p in PATHS if os.path.exists(p)]
        if libc.shmget(KEY, 0, 0) >= 0:
            found.append("sysv-shm")
        if libc.msgget(KEY, 0) >= 0:
            found.append("sysv-msg")
        if libc.semget(KEY, 0, 0) >= 0:
            found.append("sysv-sem")
        if libc.mq_open(b"/farm-leak", os.O_RDONLY, 0, None) >= 0:
            found.append("posix-mq")
        for family, address, name in ((socket.AF_UNIX, "\0farm-leak", "abstract-socket"),
                                      (socket.AF_INET, ("127.0.0.1", 47999), "tcp-port")):
            probe = socket.socket(family, socket.SOCK_STREAM)
            probe.settimeout(1)
            try:
                probe.connect(address)
                found.append(name)
            except OSError:
                pass
            probe.close()
        return found
'''

PLANT = COMMON + r'''
    for path in PATHS:
        try:
            with open(path, "w") as handle:
                handle.write("left by a planter")
        except OSError:
            pass
    libc.shmget(KEY, 4096, 0o1666)
    libc.msgget(KEY, 0o1666)
    libc.semget(KEY, 1, 0o1666)
    libc.mq_open(b"/farm-leak", os.O_CREAT | os.O_RDWR, 0o666, None)
    ready_read, ready_write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            held.bind("\0farm-leak")
            held.listen(8)
            port = socket.socket()
            port.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            port.bind(("127.0.0.1", 47999))
            port.listen(8)
            os.write(ready_write, b"1")
            while True:
                time.sleep(1)
        os._exit(0)
    os.read(ready_read, 1)
    print("planted: " + json.dumps(sorted(seen())), file=sys.stderr, flush=True)
    return False
'''

SEEK = COMMON + r'''
    found = seen()
    print("found: " + json.dumps(sorted(found)), file=sys.stderr, flush=True)
    return bool(found)
'''


def main():
    with open(os.path.join(HERE, "hostile-shared-scoring-tasks.jsonl"), "w") as out:
        task = {"task_id": "farm/leak", "prompt": PROMPT, "canonical_solution": "    return False\n",
                "test": TEST, "entry_point": "leak"}
        out.write(json.dumps(task) + "\n")
    with open(os.path.join(HERE, "hostile-shared-scoring-samples.jsonl"), "w") as out:
        for kind in ("plant", "seek", "seek", "plant", "seek", "seek"):
            body = ("    import json\n" + (PLANT if kind == "plant" else SEEK).lstrip("\n"))
            out.write(json.dumps({"task_id": "farm/leak", "completion": body}) + "\n")


if __name__ == "__main__":
    main()
