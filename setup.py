"""The wheel's packages, found on disk so that a new one cannot be left out: every ``kvgateway``
subpackage, and the dashboard in the top-level static/ (with its vendor folders) as
``kvgateway.static`` (mapped to static/ in pyproject.toml; pyproject's own package discovery cannot
prefix a directory from outside the package). Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, find_packages, setup

dashboard = ["kvgateway.static", *(f"kvgateway.static.{name}" for name in find_namespace_packages(where="static"))]
setup(packages=[*find_packages(include=["kvgateway", "kvgateway.*"]), *dashboard])
