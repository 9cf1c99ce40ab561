#!/bin/bash
echo "$GREETING" > greeting.txt
