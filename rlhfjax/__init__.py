"""rlhfjax: learning from pairwise human feedback in JAX."""

from rlhfjax.parallel import tpu as _tpu

# Before any backend starts: a CPU host with libtpu installed must not print TPU errors.
_tpu.quiet_libtpu_without_tpu()
