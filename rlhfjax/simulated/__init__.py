"""The simulated TL;DR world: posts generated from latent situations (`world.py`) and the gold
reward that judges a summary by them (`gold.py`). The simulated annotators that label by the gold
reward are in `rlhfjax.feedback.annotators`."""
