"""Validation: run a plan on the runtime at proxy scale, measure it, compare with the planner's
prediction, and calibrate the planner to this machine.

Read in this order: ``microbench`` (GEMM, memory bandwidth, attention and collective timings on
every rank at once) and ``profile`` (fit them into a hardware profile ``--cluster`` accepts),
``nccl_tests`` (the same from nccl-tests output), ``loss_trend`` (a robust test of a decreasing
loss), ``targets`` (the Day-0 targets table), ``fit`` (efficiency constants fitted to measured
runs), ``proxy_plan`` (a planned layout cut to this host and run: ``dayzero day0
--validate``). Modules that run ranks import torch inside their functions; the rest is numpy only.
"""
