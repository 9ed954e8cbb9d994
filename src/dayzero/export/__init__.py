"""A plan, launched where teams run it: one writer and one reader per engine.

Read in this order: ``common`` (the :class:`Export` an engine writer returns: its files, its launch
line and every setting the engine cannot express, listed, never dropped), ``megatron`` (the
``pretrain_gpt.py`` argument list and the Megatron-Core config objects), ``torchtitan`` (the
overrides torchtitan 0.3's ConfigManager parses), ``deepspeed`` (the
DeepSpeed config JSON and its launch line). Each engine module has ``export(spec, parallel)`` and
``import_file(path)``: importing an export gives back the same :class:`ParallelConfig`.

The schedulers run the plan on dayzero's runtime or an engine's launch: ``job`` (the
:class:`JobOptions` around a plan, the node split a scheduler can lay out, the launch of every node
with the run's data, checkpoints, interval and steps), ``slurm`` (an sbatch script that requeues
itself and resumes from the checkpoint), ``kubernetes`` (a Namespace, a ResourceQuota, a ConfigMap
of the engine's files and a Kubeflow PyTorchJob). Their ``export(spec, parallel, job=...)``
returns the same :class:`Export`; they have no importer.

``quoting`` is the one place every written value is quoted for its target (shell, ``#SBATCH``,
YAML, container command, argument file); ``readback`` builds an export's model with the engine's
own classes (Megatron-Core's GPTModel, DeepSpeed's config and transformers) to prove it is the
planned one.
"""
