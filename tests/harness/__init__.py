"""Shared test harnesses: process helpers, record factories, notebook scripts, a private
Slurm, namespaced hosts. Imported as ``harness.<module>`` (tests/ is on sys.path).
"""
