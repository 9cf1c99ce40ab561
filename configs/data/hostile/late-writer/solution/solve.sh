# A late writer: importing add.py starts a daemon (double fork, new session, every
# descriptor closed) that outlives the check and keeps writing "1" to anything that looks
# like a verdict file, while add() answers wrongly.
cat > add.py <<'PY'
import glob, os, time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 1024)
        end = time.time() + 120
        while time.time() < end:
            for path in glob.glob("/opt/farm-tests/*") + glob.glob("/opt/farm-tests/.*") + glob.glob("/tmp/*"):
                try:
                    with open(path, "w") as out:
                        out.write("1")
                except OSError:
                    pass
            time.sleep(0.02)
    os._exit(0)

def add(a, b):
    return a * b
PY
