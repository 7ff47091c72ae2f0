import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/unit helpers importable as unit.helpers

pytest_plugins = ["raygpu.testing.pytest_plugin"]
