import tensorflow_does_not_exist  # noqa: F401
