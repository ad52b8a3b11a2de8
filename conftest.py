"""Root pytest configuration: notebooks run under nbval in the kit's fast mode.

DDLKIT_FAST=1 shrinks every notebook's training to a few steps and
DDLKIT_PLOTS=static draws one final figure instead of a live widget (there is
no browser under nbval). Set them yourself to override.
"""

import os

os.environ.setdefault("DDLKIT_FAST", "1")
os.environ.setdefault("DDLKIT_PLOTS", "static")
