"""The wheel's packages and its compiled core.

Packages: found on disk so that a new one cannot be left out: every ``kvgateway`` subpackage, and
the dashboard in the top-level static/ (with its vendor folders) as ``kvgateway.static`` (mapped to
static/ in pyproject.toml; pyproject's own package discovery cannot prefix a directory from outside
the package). Everything else is in pyproject.toml.

The compiled core (docs/performance.md, "The compiled core"): the Cython modules below, each the
twin of a pure-Python module that stays as the reference. Where they cannot be built (no C
compiler, no Cython, or ``KVGATEWAY_NO_EXTENSIONS=1`` at build time) the install still succeeds,
pure Python, and says so in one warning line.
"""

import os
import sys

from setuptools import Extension, find_namespace_packages, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NO_EXTENSIONS = os.environ.get("KVGATEWAY_NO_EXTENSIONS", "") not in ("", "0")
SOURCES = {
    "kvgateway.state._learner_c": "kvgateway/state/_learner_c.pyx",
    "kvgateway.protocol._render_c": "kvgateway/protocol/_render_c.pyx",  # includes kvgateway/protocol/_render_py.py
    "kvgateway.state._digest_c": "kvgateway/state/_digest_c.pyx",
    "kvgateway.state._apply_c": "kvgateway/state/_apply_c.pyx",
    "kvgateway.state._analytics_c": "kvgateway/state/_analytics_c.pyx",
    "kvgateway.engine._tokens_c": "kvgateway/engine/_tokens_c.pyx",
    "kvgateway.engine._events_c": "kvgateway/engine/_events_c.pyx",
    "kvgateway.engine._batch_c": "kvgateway/engine/_batch_c.pyx",
    "kvgateway.engine._receive_c": "kvgateway/engine/_receive_c.pyx",
    "kvgateway.log._ring_c": "kvgateway/log/_ring_c.pyx",
    "kvgateway.ingest._outlet_c": "kvgateway/ingest/_outlet_c.pyx",
}
BUILD_ERRORS = (CCompilerError, ExecError, PlatformError, OSError, ValueError)
"""What a missing or broken compiler raises (distutils' CompileError and LinkError are
CCompilerErrors; a compiler that cannot even start is an ExecError or an OSError)."""


def _warn(reason: object) -> None:
    sys.stderr.write(
        f"WARNING: kvgateway: the compiled core was not built ({reason}); installing the pure-Python core\n"
    )


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python: one warning line, and the install goes on.
    (setuptools' build_ext cythonizes the .pyx sources itself when Cython is importable.)"""

    def run(self) -> None:
        if NO_EXTENSIONS:
            return _warn("KVGATEWAY_NO_EXTENSIONS is set")
        try:
            import Cython  # noqa: F401
        except ImportError:
            return _warn("Cython is not installed")
        try:
            super().run()
        except BUILD_ERRORS as exc:
            _warn(_last_line(exc))

    def build_extension(self, ext: Extension) -> None:
        # raised here, the error stops the whole run (one warning, no half-compiled core)
        super().build_extension(ext)


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


dashboard = ["kvgateway.static", *(f"kvgateway.static.{name}" for name in find_namespace_packages(where="static"))]
setup(
    packages=[*find_packages(include=["kvgateway", "kvgateway.*"]), *dashboard],
    ext_modules=[Extension(name, [source]) for name, source in SOURCES.items()],
    cmdclass={"build_ext": OptionalBuildExt},
)
