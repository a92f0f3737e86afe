"""Proxy judges on pairs of the real world's references (two draws per post)."""
import math, sys
import numpy as np
sys.path.insert(0, __import__("os").path.dirname(__file__))
import proxy
from rlhfjax.simulated import world
def ref_real(s, rng, noise=1.0):
  # draw a reference through the world's own generator; log p unknown -> 0 (only RM/length used)
  return world._reference(s, rng, noise), 0.0
print({k: round(float(v), 1) for k, v in proxy.study(ref_real).items()})
