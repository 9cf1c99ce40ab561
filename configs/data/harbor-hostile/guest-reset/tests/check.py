import sys
sys.exit(0 if open("/app/answer.txt").read().strip() == "29" else 1)
