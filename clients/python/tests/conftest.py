"""Tests run against this checkout's farm_sdk, installed or not."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
