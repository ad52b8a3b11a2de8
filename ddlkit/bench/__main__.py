"""python -m ddlkit.bench [--quick] ...: see ddlkit.bench.cli."""

from ddlkit.bench.cli import main

raise SystemExit(main())
