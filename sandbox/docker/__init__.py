"""The docker sandbox image: its recipe (``build-image.sh``, ``packages.txt``) and ``image``, which
starts a docker daemon when one is installed but not running and builds the image once.

The container that runs a sandbox child is ``sandbox.docker_backend``.

May import: sandbox.errors, the standard library.
"""
