"""``python -m ddlkit.k8s {manifest,exec} ...`` (see ddlkit.k8s.cli)."""

from ddlkit.k8s.cli import main

raise SystemExit(main())
