# A hard link to root's expected answer: no symbolic link to refuse, the same inode. The
# kernel must refuse to link a file the candidate neither owns nor may read and write.
printf '%s\n' 'import subprocess' \
  'subprocess.run(["ln", "-f", "/var/lib/farm-check/expected.txt", "/workspace/answer.txt"])' > solve.py
