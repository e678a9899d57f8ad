"""ctest's python_tests: pytest over this folder against the module built beside it (PYTHONPATH set by ctest);
exit 77 (skipped) when this interpreter has no pytest (Debian: python3-pytest, scripts/install-deps.sh)."""
import sys
from pathlib import Path

try:
    import pytest
except ImportError:
    print(f"SKIP: {sys.executable} has no pytest (install python3-pytest, or pip install pytest)")
    sys.exit(77)

sys.exit(pytest.main([str(Path(__file__).parent), "-q", "-p", "no:cacheprovider"]))
