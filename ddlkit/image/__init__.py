"""The kit's container image (``Containerfile``), built here with buildah and run with podman.

:mod:`ddlkit.image.podman` holds how podman runs on this machine; :mod:`ddlkit.image.build`
builds the image; :mod:`ddlkit.k8s.containers` runs a manifest's pods as its containers.
"""

KIT_IMAGE = "localhost/ddlkit:0.1.0"  # what `make image` tags; only this machine can run it


def push_hint(image: str) -> str | None:
    """How to make ``image`` pullable by a cluster, if it is a local build (pure); else None."""
    if not image.startswith("localhost/"):
        return None
    remote = "REGISTRY/" + image.removeprefix("localhost/")
    return (
        f"{image} is this machine's build (`make image`); a cluster pulls only from a registry: "
        f"podman tag {image} {remote} && podman push {remote}, then pass --image {remote}"
    )
