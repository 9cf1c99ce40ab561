# The task's own setup leaves a hard link in the workspace to a file outside it.
ln /usr/local/bin/farm-sandbox sandbox-copy
