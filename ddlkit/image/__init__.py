"""The kit's container image (``Containerfile``), built here with buildah and run with podman.

:mod:`ddlkit.image.podman` holds how podman runs on this machine; :mod:`ddlkit.image.build`
builds the image; :mod:`ddlkit.k8s.containers` runs a manifest's pods as its containers.
"""
