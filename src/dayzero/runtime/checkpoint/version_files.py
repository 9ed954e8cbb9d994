"""The names of the files a version holds besides DCP's shards and index, and the manifest."""

TRAIN_STATE = "train_state.json"  # step, data-stream position, loop extras, LR scheduler (rank 0)
OPTIM_GROUPS = "optimizer_groups.json"  # the optimizer's small state: hyperparameters and step per parameter name


def rng_file(rank: int) -> str:
    """One rank's RNG states."""
    return f"rng-{rank:05d}.json"
