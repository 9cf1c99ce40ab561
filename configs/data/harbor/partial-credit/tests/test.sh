#!/bin/bash
cd /work
python3 /tests/score.py > /logs/verifier/reward.json 2>/logs/verifier/score.err || echo '{"reward": 0}' > /logs/verifier/reward.json
