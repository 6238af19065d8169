import os
import sys

# Make `reference` importable from every test module.
sys.path.insert(0, os.path.dirname(__file__))
