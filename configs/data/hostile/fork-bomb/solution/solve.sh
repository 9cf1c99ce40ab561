# A fork bomb; the step limit must end it and the farm must carry on.
bomb() { bomb | bomb & }
bomb
sleep 600
