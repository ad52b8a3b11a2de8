"""``python -m ddlkit.spark driver ...``: the driver process of a Spark run."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] != ["driver"]:
        sys.exit(
            "usage: python -m ddlkit.spark driver --master URL --strategy S --workers N "
            "SCRIPT [-- ARGS]"
        )
    from ddlkit.spark.driver import main

    sys.exit(main(sys.argv[2:]))
