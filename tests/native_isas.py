"""Every ISA copy of the native kernels as a pytest parameter, skipped where this CPU or build
cannot run it (shared by the kernel tests)."""

import pytest

from ember.backend import native

ISAS = [
    pytest.param(
        isa,
        marks=pytest.mark.skipif(
            isa not in native.runnable_isas(), reason=f"this CPU or build cannot run {isa}"
        ),
    )
    for isa in native.ISAS
]
