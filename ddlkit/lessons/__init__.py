"""The helpers that serve the course's notebooks, one module per lesson, apart from the kit's
machinery (launching, metrics, environments, the benchmark). Each is offered under its
lesson's name (``dk.mirrored``, ``dk.ps``, ...).

- :mod:`~ddlkit.lessons.mirrored` (01): MirroredStrategy made visible: mirrored variables,
  the all-reduce, the batch split, the one-step check, ``train_and_measure``.
- :mod:`~ddlkit.lessons.replicas` (01, 04, ``launch/train_mirrored.py``): the devices of
  in-process strategies, GPUs where they exist, else logical CPUs.
- :mod:`~ddlkit.lessons.faults` (02, 02c): fault tolerance: who writes a job's files, the
  backups a run has made, where a relaunch resumes.
- :mod:`~ddlkit.lessons.ps` (03, 03a): parameter-server runs seen from the notebook:
  placement, staleness, waiting for a step.
- :mod:`~ddlkit.lessons.ps_compare` (03a): runs side by side, time to accuracy and staleness
  (re-exported by ``ps``).
- :mod:`~ddlkit.lessons.memory` (04b): what each replica holds, and ZeRO's stages, in bytes.
- :mod:`~ddlkit.lessons.scripts` (the solutions and the tests; ``dk.lesson``): a lesson's
  ``%%writefile`` scripts read back out of its notebook.
"""
