"""``python -m ddlkit.ray driver ...`` (the driver of a Ray run) or ``... check ADDRESS``."""

import sys

if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["driver"]:
        from ddlkit.ray.driver import main

        sys.exit(main(sys.argv[2:]))
    if command == ["check"] and len(sys.argv) == 3:
        from ddlkit.ray.driver import check_main

        sys.exit(check_main(sys.argv[2:]))
    sys.exit(
        "usage: python -m ddlkit.ray driver --address HOST:PORT --strategy S --workers N "
        "SCRIPT [-- ARGS]\n       python -m ddlkit.ray check HOST:PORT"
    )
