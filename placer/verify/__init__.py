"""Checks of a plan on real (or emulated) hardware, and calibration of the cost model from them.

- ``calibrate``: collective and GEMM sweeps under torchrun -> least-squares fits -> a link
  profile (``placer calibrate``; ``estimate``/``recommend-layout --profile`` read it);
- ``replay`` + ``session``: each candidate's training step as a program every rank replays,
  its predicted time (the cost model at the replay's sizes, simulated), the measured one, and
  the comparison (``placer verify``); ``feedback`` refits the profile from the replays;
- ``runner``: where workers run (``emulate.EmulatedCluster`` namespaces, or a local torchrun);
  ``workers/``: the scripts torchrun starts (torch + stdlib + placer_mesh);
- ``fit``: weighted least squares and Kendall's tau; ``cpu_cluster``/``plans``: the emulated
  cluster's description and hand-picked plans for checks; ``output``: what verify prints.

Nothing here is imported by lower layers; ``cost`` learns from it only through a profile file.
"""
