#!/bin/bash
python3 --version > /answer.txt
