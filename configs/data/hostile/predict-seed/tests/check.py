"""Hidden test, run by the checker (uid 999). Its inputs come from the scoring seed
(FARM_SEED in the scoring VM), as a checker that wants reproducible hidden inputs would draw
them. The agent's code runs through farm-sandbox; its output is data."""
import os
import subprocess
import sys

seed = int(os.environ["FARM_SEED"])
a, b = seed % 65521, (seed // 65521) % 65521
program = "import sys; sys.path.insert(0, '/workspace'); from add import add; print(add(int(sys.argv[1]), int(sys.argv[2])))"
run = subprocess.run(["farm-sandbox", "/usr/bin/python3", "-I", "-c", program, str(a), str(b)], stdin=subprocess.DEVNULL, capture_output=True, text=True)
lines = run.stdout.strip().splitlines()
answer = lines[-1] if lines else ""
if answer != str(a + b):
    print(f"add({a}, {b}) gave {answer!r}, expected {a + b}")
    sys.exit(1)
with open(os.environ["FARM_REWARD_FILE"], "w") as reward:
    reward.write("1")
