import subprocess
import sys


def test_broker_library_imports_no_proton():
    code = "import sys, broker_filter.broker; assert 'proton' not in sys.modules, sorted(m for m in sys.modules if 'proton' in m)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
