"""Resilience: how a job survives and reports failures, and how it stops.

Read in this order: ``stopping`` (SIGINT/SIGTERM and the launcher's death: how every rank stops),
``rank_log`` (what a spawned rank shows on the terminal, its one-line failure cause, the run's
``ranks.log``), ``faults`` (fault drills: a rank that fails or straggles on purpose), ``watchdog``
(a hang turned into a restart), ``guards`` (NaN/Inf and spike checks on the loss), ``loop`` (the
:class:`Resilience` a training loop calls: resume, periodic saves, drills, watchdog and guards in
one place), ``actions`` (what an in-process alert makes every rank do: log, checkpoint, restart,
exclude), ``exclusion`` (the run's exclusion list and the layout a restart takes without those
ranks), ``relaunch`` (the launcher's side: the next attempt's slots, layout and config files).
"""
