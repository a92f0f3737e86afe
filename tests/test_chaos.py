"""The chaos run (tests/chaos.py), reduced: the tiny pipeline's first two stages (SFT, labels)
killed with SIGKILL at 5 random points, relaunched each time, and compared with the uninterrupted
tiny pipeline of this session; then DAPO (the GRPO step with its dynamic-sampling refill: an online
method) and KTO (an offline one), each killed in the middle of its run and relaunched, compared
with an uninterrupted run of each: label files, outputs, reports, metrics and checkpoints equal.
(Every method, 20 kills: docs/reliability.md; two processes killed and relaunched:
tests/test_multiprocess.py.)"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos  # noqa: E402

STAGES = ("sft", "label")
CONFIG = "configs/tldr_sim.py:tiny"


def test_five_kills_end_as_the_uninterrupted_run(tiny_pipeline, tmp_path, monkeypatch):
  _, clean = tiny_pipeline
  # The relaunched runs compile as a user's do: from the session's compilation cache (conftest)
  # they would finish the two stages before the first kill could land in them.
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  rng, events, rounds = random.Random(0), [], 0
  # On a fast CPU a relaunch can finish both stages before its kill lands; such a kill (while the
  # process exits) is checked like the others but not counted, and a fresh workdir starts again.
  in_stages = lambda: [e for e in events if e["stage"] in STAGES]
  while len(in_stages()) < 5:
    rounds += 1
    assert rounds <= 10, f"fewer than 5 kills landed in {STAGES} in 10 rounds: {events}"
    workdir = str(tmp_path / f"chaos{rounds}")
    events += chaos.run_with_kills(CONFIG, workdir, 5 - len(in_stages()), rng,
                                   print, window=(3.0, 6.0),
                                   extra=(f"--config.stages={','.join(STAGES)}",),
                                   stages=STAGES)
    assert chaos.differences(clean, workdir, only=STAGES) == [], events


METHODS = ("dapo", "kto")


def test_methods_killed_mid_run_end_as_their_uninterrupted_runs(tiny_pipeline, tmp_path):
  """Each method from the session's SFT, labels and reward model, with a checkpoint after every
  step, killed as soon as its first checkpoint is written (in its second step: DAPO's refill
  draws, KTO's next batches) and relaunched to the end. (Kills at random moments, in start-up,
  sampling, steps, checkpoints and outputs alike: tests/chaos.py.)"""
  _, source = tiny_pipeline
  every = "--config.checkpoint.every=1"
  clean = str(tmp_path / "clean")
  chaos.copy_needs(source, clean, "dapo")  # SFT, labels, RM: what both methods need.
  chaos.finish(CONFIG, clean, (f"--config.stages={','.join(METHODS)}", every))
  for method in METHODS:
    workdir = str(tmp_path / method)
    chaos.copy_needs(source, workdir, method)
    flags = (f"--config.stages={method}", every)
    saved = chaos.kill_after_checkpoint(chaos.command(CONFIG, workdir) + list(flags), workdir,
                                        method)
    assert saved is not None, f"{method} finished before its kill"
    chaos.finish(CONFIG, workdir, flags)
    assert chaos.differences(clean, workdir, only=(method,)) == [], (method, saved)
