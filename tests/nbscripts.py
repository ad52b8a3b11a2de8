"""Moved to tests/harness/nbscripts.py: import ``harness.nbscripts``.

This name stays while the notebook helpers' test files written against
``from nbscripts import ...`` (issue 12, in flight) land; delete it once none is left
(``git grep -n "from nbscripts"``).
"""

from harness.nbscripts import NOTEBOOKS, extract, no_ddlkit_env, write_scripts

__all__ = ["NOTEBOOKS", "extract", "no_ddlkit_env", "write_scripts"]
