#!/bin/bash
echo "$GREETING" > greeting.txt
echo "wrote $(pwd)/greeting.txt"
