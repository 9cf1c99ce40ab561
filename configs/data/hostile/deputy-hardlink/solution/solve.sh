# A hard link to root's expected answer: no symbolic link to refuse, the same inode. The
# kernel must refuse to link a file the candidate neither owns nor may read and write.
cat > solve.py <<'PY'
import os
try:
    os.remove("/workspace/answer.txt")
except FileNotFoundError:
    pass
os.link("/var/lib/farm-check/expected.txt", "/workspace/answer.txt")
PY
